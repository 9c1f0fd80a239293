package records

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func files(recipeText, lock string) *Files {
	return &Files{Recipe: []byte(recipeText), Lock: []byte(lock), Extra: map[string][]byte{}}
}

const recipeV1 = "name = \"tools\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"

func TestRecordsCompareAndSwap(t *testing.T) {
	rs := Open(t.TempDir())
	ctx := context.Background()
	v, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil)
	if err != nil || v.N != 1 {
		t.Fatalf("add: %+v %v", v, err)
	}
	if _, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil); !errors.Is(err, ErrConflict) {
		t.Errorf("second add of a new record: %v, want ErrConflict", err)
	}
	// Ten racing versions on base 1: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rs.Add(ctx, Version{Name: "tools", Base: 1, By: "op"}, files(recipeV1+"# "+string(rune('a'+i))+"\n", "lock\n"), nil)
			if err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d racing adds on one base won, want 1", wins)
	}
	log, err := rs.Log("tools")
	if err != nil || len(log) != 2 {
		t.Errorf("log: %d versions, %v", len(log), err)
	}
}

// TestAddWritesWhole: a version holds its files (key files in subdirectories too), current names it,
// nothing temporary is left; a version directory left past current by a crash is replaced, not a
// record stuck; Allow rewrites version.json in place.
func TestAddWritesWhole(t *testing.T) {
	rs := Open(t.TempDir())
	ctx := context.Background()
	f := files(recipeV1, "lock1\n")
	f.Extra["keys/repo.asc"] = []byte("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
	if _, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, f, nil); err != nil {
		t.Fatal(err)
	}
	// What a crash after the rename of version 2 and before current's write leaves.
	if err := os.MkdirAll(rs.Dir("tools", 2), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rs.Dir("tools", 2), "workshop.toml"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cur, err := rs.Current("tools"); err != nil || cur.N != 1 {
		t.Fatalf("current: %+v %v", cur, err)
	}
	v, err := rs.Add(ctx, Version{Name: "tools", Base: 1, By: "op"}, files(recipeV1+"# 2\n", "lock2\n"), nil)
	if err != nil || v.N != 2 {
		t.Fatalf("add over a crashed add's debris: %+v %v", v, err)
	}
	if b, _ := os.ReadFile(rs.File("tools", 2)); string(b) != recipeV1+"# 2\n" {
		t.Errorf("version 2 is %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(rs.Dir("tools", 1), "keys", "repo.asc")); string(b) != string(f.Extra["keys/repo.asc"]) {
		t.Errorf("version 1's key file is %q", b)
	}
	if _, err := rs.Allow("tools", []string{"alice", "@dev"}); err != nil {
		t.Fatal(err)
	}
	if got, err := rs.Current("tools"); err != nil || got.N != 2 || len(got.Users) != 2 {
		t.Errorf("after allow: %+v %v", got, err)
	}
	if _, err := rs.Allow("../x", nil); !errors.Is(err, ErrNoRecord) {
		t.Errorf("allow of a name that is no record's: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(rs.dir, "tools"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if fmt.Sprint(names) != "[1 2 current]" {
		t.Errorf("the record's directory holds %q, want [1 2 current]", names)
	}
}

// TestTagsAndRemove: tags name versions (default is always the current one), move when set again,
// refuse bad names and default; a removed record no longer lists nor resolves, its versions kept.
func TestTagsAndRemove(t *testing.T) {
	rs := Open(t.TempDir())
	ctx := context.Background()
	if _, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "l\n"), nil); err != nil {
		t.Fatal(err)
	}
	if n, err := rs.SetTags("tools", 0, []string{"v1", "stable"}, nil); err != nil || n != 1 {
		t.Fatalf("tag: %d %v", n, err)
	}
	if _, err := rs.Add(ctx, Version{Name: "tools", Base: 1, By: "op"}, files(recipeV1+"# 2\n", "l\n"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.SetTags("tools", 2, []string{"stable"}, []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	tags, err := rs.Tags("tools")
	if err != nil || len(tags) != 2 || tags["stable"].Version != 2 || tags[DefaultTag].Version != 2 {
		t.Errorf("tags: %v %v", tags, err)
	}
	if v, err := rs.Resolve("tools", "stable"); err != nil || v.N != 2 {
		t.Errorf("resolve stable: %+v %v", v, err)
	}
	for _, bad := range []string{"default", "Bad", "../x", ""} {
		if _, err := rs.SetTags("tools", 0, []string{bad}, nil); err == nil {
			t.Errorf("tag %q was set", bad)
		}
	}
	if _, err := rs.SetTags("tools", 7, []string{"x"}, nil); !errors.Is(err, ErrNoRecord) {
		t.Errorf("a tag of version 7: %v", err)
	}
	if err := rs.Remove("tools"); err != nil {
		t.Fatal(err)
	}
	if names, _ := rs.Names(); len(names) != 0 {
		t.Errorf("names after remove: %v", names)
	}
	if _, err := rs.Current("tools"); !errors.Is(err, ErrNoRecord) {
		t.Errorf("current after remove: %v", err)
	}
	kept, _ := filepath.Glob(filepath.Join(rs.dir, ".removed", "tools-*", "2", "workshop.toml"))
	if len(kept) != 1 {
		t.Errorf("the removed record's versions: %v", kept)
	}
	if err := rs.Remove("tools"); !errors.Is(err, ErrNoRecord) {
		t.Errorf("a second remove: %v", err)
	}
	// A name may be recorded again.
	if v, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "l\n"), nil); err != nil || v.N != 1 {
		t.Errorf("add after remove: %+v %v", v, err)
	}
}

package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// limitsRecord records name, a Workshop of the Debian seed alone (sh, tar, coreutils; no network)
// that nobody may launch, and realizes it: the launches of the tests below race on the supervisor's
// limits, not on a first build.
func limitsRecord(t *testing.T, sock, name string) {
	t.Helper()
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = %q\nseed = \"debian/bookworm\"\n", name))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", f); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	if r := via(t, sock, 0, "", "realize", name); r.code != 0 {
		t.Fatalf("realize: %s", r.stderr)
	}
}

// nobodyKey is a new E2B API key of nobody's.
func nobodyKey(t *testing.T, sock string) string {
	t.Helper()
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil || key.Key == "" {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}
	return key.Key
}

// e2bCall is one plain HTTP request to the E2B API at addr; it returns the status and the body.
func e2bCall(t *testing.T, method, url string, header map[string]string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// benchesOf lists the Benches that `shed bench ls` shows an operator, of owner.
func benchesOf(t *testing.T, sock, owner string) []benchJSON {
	t.Helper()
	r := via(t, sock, 0, "", "--json", "bench", "ls")
	var all []benchJSON
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatalf("bench ls: %v %s %s", err, r.stdout, r.stderr)
	}
	var out []benchJSON
	for _, b := range all {
		if b.Owner == owner {
			out = append(out, b)
		}
	}
	return out
}

type benchJSON struct{ ID, Name, Owner string }

// TestE2BCreateRace: a key holder sends 20 creates at once (plain POST /sandboxes) to a supervisor
// with --user-benches 8: exactly 8 succeed, every other is refused (403 or 429) saying which limit,
// and `shed bench ls` shows 8 Benches of the key's user, not 20.
func TestE2BCreateRace(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	// A store of its own: the limit counts every Bench of nobody's in the store, and the tests
	// that run beside this one launch nobody's Benches in the shared store.
	root := seededRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr, "--user-benches", "8")
	name := "race-" + strconv.Itoa(os.Getpid())
	limitsRecord(t, sock, name)
	key := nobodyKey(t, sock)
	nobodyBefore := len(benchesOf(t, sock, "nobody"))
	if nobodyBefore != 0 {
		t.Fatalf("nobody has %d Benches before the race", nobodyBefore)
	}

	const n = 20
	type answer struct {
		code int
		body string
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			code, body := e2bCall(t, "POST", "http://"+addr+"/sandboxes", map[string]string{"X-API-Key": key, "Content-Type": "application/json"},
				strings.NewReader(fmt.Sprintf(`{"templateID":%q,"timeout":600}`, name)))
			answers[i] = answer{code, body}
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for _, a := range answers {
		switch {
		case a.code == http.StatusCreated:
			created++
		case (a.code == http.StatusForbidden || a.code == http.StatusTooManyRequests) && strings.Contains(a.body, "you have 8 Benches, the most a user may") && strings.Contains(a.body, "--user-benches"):
		default:
			t.Errorf("a create: %d %s, want 201, or 403/429 naming the limit", a.code, a.body)
		}
	}
	if created != 8 {
		t.Errorf("20 creates at once with --user-benches 8: %d created", created)
	}
	if got := benchesOf(t, sock, "nobody"); len(got) != 8 {
		t.Errorf("after 20 creates at once with --user-benches 8, bench ls shows %d of nobody's: %v", len(got), got)
	}
}

// TestE2BUploadOneCommand: one multipart POST /files of 2,000 one-byte parts (about 200 KB) was 2,000
// commands in the Bench and 2,000 fsynced audit entries. It is one bench.write_files: one audit
// entry, and every file is in the Bench with its byte; the answer is envd's, a {name,type,path} per
// file. A form of more parts than the bound is refused (413) and writes nothing.
func TestE2BUploadOneCommand(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	name := "upload-" + strconv.Itoa(os.Getpid())
	limitsRecord(t, sock, name)
	key := nobodyKey(t, sock)
	code, body := e2bCall(t, "POST", "http://"+addr+"/sandboxes", map[string]string{"X-API-Key": key}, strings.NewReader(fmt.Sprintf(`{"templateID":%q}`, name)))
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	var id string
	for _, b := range benchesOf(t, sock, "nobody") {
		if b.Name == sb.SandboxID {
			id = b.ID
		}
	}
	if id == "" {
		t.Fatalf("sandbox %s has no Bench", sb.SandboxID)
	}
	upload := func(dir string, parts int) (int, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for i := range parts {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s/f%04d"`, dir, i))
			h.Set("Content-Type", "application/octet-stream")
			w, err := mw.CreatePart(h)
			if err != nil {
				t.Fatal(err)
			}
			w.Write([]byte{byte('a' + i%26)})
		}
		mw.Close()
		return e2bCall(t, "POST", "http://"+addr+"/files", map[string]string{
			"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": mw.FormDataContentType(),
		}, &buf)
	}
	writes := func() (many, one int) {
		t.Helper()
		r := via(t, sock, 0, "", "--json", "audit", "--bench", id)
		var es []struct{ Event, Detail string }
		if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
			t.Fatalf("audit ls: %v %s", err, r.stderr)
		}
		for _, e := range es {
			switch e.Event {
			case "bench.write_files":
				many++
				if !strings.Contains(e.Detail, "2000 files, first /root/up/f0000") {
					t.Errorf("the upload's audit entry: %q", e.Detail)
				}
			case "bench.write_file":
				one++
			}
		}
		return many, one
	}

	code, body = upload("/root/up", 2000)
	var infos []struct{ Name, Type, Path string }
	if err := json.Unmarshal([]byte(body), &infos); code != http.StatusOK || err != nil || len(infos) != 2000 {
		t.Fatalf("upload of 2,000 parts: %d %v %.300s", code, err, body)
	}
	if i := infos[1999]; i.Name != "f1999" || i.Type != "file" || i.Path != "/root/up/f1999" {
		t.Errorf("the answer for the last file: %+v", i)
	}
	if many, one := writes(); many != 1 || one != 0 {
		t.Errorf("an upload of 2,000 files: %d bench.write_files and %d bench.write_file audit entries, want 1 and 0", many, one)
	}
	r := via(t, sock, 0, "", "bench", "exec", sb.SandboxID, "--", "sh", "-c", "ls /root/up | wc -l; cat /root/up/*")
	var want strings.Builder
	var names []string
	for i := range 2000 {
		names = append(names, fmt.Sprintf("f%04d", i))
	}
	sort.Strings(names)
	for _, n := range names {
		i, _ := strconv.Atoi(n[1:])
		want.WriteByte(byte('a' + i%26))
	}
	if r.code != 0 || r.stdout != "2000\n"+want.String() {
		t.Errorf("the uploaded files in the Bench: %d %.100q %s", r.code, r.stdout, r.stderr)
	}

	code, body = upload("/root/over", 4097)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "more than 4096 parts") {
		t.Errorf("an upload of 4,097 parts: %d %s, want 413 naming the bound", code, body)
	}
	if r := via(t, sock, 0, "", "bench", "exec", sb.SandboxID, "--", "sh", "-c", "test -e /root/over && echo written || echo nothing"); r.stdout != "nothing\n" {
		t.Errorf("an upload over the bound: %s %s", r.stdout, r.stderr)
	}
	if many, one := writes(); many != 1 || one != 0 {
		t.Errorf("after a refused upload: %d bench.write_files and %d bench.write_file audit entries, want 1 and 0", many, one)
	}
}

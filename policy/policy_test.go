package policy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

const recipeText = "name = \"tools\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"

// newService is a real store with a signing key and one record, "tools", that alice (and @devs)
// may use.
func newService(t *testing.T) *app.Service {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is root-only (CI runs as root)")
	}
	root := filepath.Join(t.TempDir(), "root")
	st, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	f := &records.Files{Recipe: []byte(recipeText), Lock: []byte("# lock\n"), Extra: map[string][]byte{}}
	if _, err := records.Open(root).Add(context.Background(), records.Version{Name: "tools", By: "root", Users: []string{"alice", "@devs"}}, f, nil); err != nil {
		t.Fatal(err)
	}
	return &app.Service{Root: root, Version: "test", Policy: Check, UserLimits: sandbox.Limits{MemoryBytes: 1 << 30, Pids: 100}}
}

// snapshot is every file under root with its content's hash: what a refused request must leave as it
// was, byte for byte.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			out[rel] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = fmt.Sprintf("%x", sha256.Sum256(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// requests is one request of every operation, each as an attacker would like it to pass: naming the
// record, grants, substituters, another user's Bench.
func requests() map[string]any {
	return map[string]any{
		"init":                &app.InitRequest{KeyName: "evil-1"},
		"realize":             &app.RealizeRequest{Workshop: "tools", Offline: true},
		"lock":                &app.LockRequest{File: "/etc/passwd"},
		"instantiate":         &app.InstantiateRequest{File: "/etc/shadow"},
		"why":                 &app.WhyRequest{Workshop: "tools", File: "/usr/bin/jq"},
		"diff":                &app.DiffRequest{A: "tools", B: "tools"},
		"k8s.manifests":       &app.K8sManifestsRequest{Workshop: "tools", Image: "registry.example/shed:tools", Replicas: 1},
		"bench.run":           &app.BenchRunRequest{Workshop: "tools", Argv: []string{"true"}, Offline: true},
		"bench.ls":            &app.BenchListRequest{},
		"bench.exec":          &app.BenchExecRequest{Bench: "someones", Argv: []string{"true"}},
		"bench.logs":          &app.BenchRequest{Bench: "someones"},
		"bench.rm":            &app.BenchRemoveRequest{Benches: []string{"someones"}},
		"bench.propose":       &app.BenchRequest{Bench: "someones"},
		"bench.create":        &app.BenchCreateRequest{Workshop: "tools"},
		"bench.write_file":    &app.WriteFileRequest{Bench: "someones", Path: "/root/x", Content: "x"},
		"bench.write_files":   &app.WriteFilesRequest{Bench: "someones", Files: []app.FileWrite{{Path: "/root/x", Content: "x"}}},
		"bench.read_file":     &app.ReadFileRequest{Bench: "someones", Path: "/etc/shadow"},
		"bench.list_files":    &app.ListFilesRequest{Bench: "someones", Path: "/root"},
		"agent.key_create":    &app.KeyCreateRequest{User: "root"},
		"agent.key_ls":        &app.Empty{},
		"agent.key_rm":        &app.KeyRemoveRequest{ID: "user:root"},
		"secret.add":          &app.SecretAddRequest{Name: "tok", Value: []byte("v"), Hosts: []string{"api.example.com"}, Place: "basic", Replace: true},
		"secret.ls":           &app.Empty{},
		"secret.rm":           &app.SecretRequest{Name: "someones"},
		"secret.update":       &app.SecretUpdateRequest{Name: "someones", Value: []byte("v")},
		"bench.stat_file":     &app.BenchPathRequest{Bench: "someones", Path: "/etc/shadow"},
		"bench.make_dir":      &app.BenchPathRequest{Bench: "someones", Path: "/root/x"},
		"bench.remove_file":   &app.BenchPathRequest{Bench: "someones", Path: "/root"},
		"bench.move_file":     &app.MoveFileRequest{Bench: "someones", From: "/root", To: "/tmp/r"},
		"bench.watch_dir":     &app.WatchDirRequest{Bench: "someones", Path: "/root", Recursive: true},
		"bench.set_lifetime":  &app.SetLifetimeRequest{Bench: "someones", LifetimeS: 86400},
		"bench.set_network":   &app.SetNetworkRequest{Bench: "someones", Deny: []string{"0.0.0.0/0"}},
		"bench.network":       &app.BenchRequest{Bench: "someones"},
		"bench.metrics":       &app.BenchMetricsRequest{Benches: []string{"someones"}},
		"bench.pause":         &app.BenchPauseRequest{Bench: "someones"},
		"bench.resume":        &app.BenchResumeRequest{Bench: "someones"},
		"bench.fork":          &app.BenchForkRequest{Bench: "someones", Count: 3},
		"bench.reset":         &app.BenchResetRequest{Bench: "someones"},
		"snapshot.create":     &app.SnapshotCreateRequest{Bench: "someones", Name: "s"},
		"snapshot.ls":         &app.SnapshotListRequest{},
		"snapshot.rm":         &app.SnapshotRemoveRequest{Snapshot: "0123456789abcdef"},
		"workshop.launchable": &app.LaunchableRequest{},
		"audit.ls":            &app.AuditRequest{},
		"audit.verify":        &app.AuditVerifyRequest{},
		"workshop.add":        &app.WorkshopAddRequest{File: "/etc/passwd"},
		"workshop.allow":      &app.WorkshopAllowRequest{Name: "tools", Users: []string{"nobody"}},
		"workshop.ls":         &app.WorkshopListRequest{},
		"workshop.show":       &app.WorkshopShowRequest{Name: "tools"},
		"workshop.log":        &app.WorkshopRequest{Name: "tools"},
		"workshop.diff":       &app.WorkshopDiffRequest{Name: "tools"},
		"workshop.promote":    &app.PromoteRequest{ID: "0123456789abcdef", DiffSHA256: strings.Repeat("0", 64)},
		"workshop.submit":     &app.WorkshopSubmitRequest{Name: "tools", Recipe: "name = \"other\"\nseed = \"debian/bookworm\"\n"},
		"workshop.rm":         &app.WorkshopRemoveRequest{Name: "gone"},
		"workshop.tag":        &app.WorkshopTagRequest{Name: "tools", Tags: []string{"v1"}},
		"workshop.tags":       &app.WorkshopRequest{Name: "tools"},
		"proposal.show":       &app.ProposalRequest{ID: "0123456789abcdef"},
		"store.ls":            &app.StoreListRequest{},
		"store.info":          &app.PathRequest{Path: "00000000000000000000000000000000-x"},
		"store.verify":        &app.VerifyRequest{},
		"store.stats":         &app.StoreStatsRequest{},
		"store.optimise":      &app.OptimiseRequest{},
		"store.sign":          &app.SignRequest{},
		"store.add":           &app.StoreAddRequest{Dir: "/etc/hostname"},
		"root.add":            &app.RootAddRequest{Name: "x", Path: "00000000000000000000000000000000-x"},
		"root.ls":             &app.RootListRequest{},
		"root.rm":             &app.RootRequest{Name: "tools"},
		"gc":                  &app.GCRequest{},
		"log":                 &app.PathRequest{Path: "00000000000000000000000000000000-x"},
		"key.show":            &app.KeyShowRequest{},
		"key.rotate":          &app.KeyRotateRequest{},
		"key.trust":           &app.KeyRequest{Key: "evil-1:" + strings.Repeat("A", 43) + "="},
		"key.untrust":         &app.KeyRequest{Key: "test-1"},
		"copy":                &app.CopyRequest{To: "oci-layout:/tmp/x"},
		"import":              &app.ImportRequest{Dir: "/tmp"},

		"bench.watcher_create": &app.WatcherCreateRequest{Bench: "someones", Path: "/root"},
		"bench.watcher_events": &app.WatcherRequest{Bench: "someones", Watcher: "w1"},
		"bench.watcher_remove": &app.WatcherRequest{Bench: "someones", Watcher: "w1"},
	}
}

// TestEveryOperationHasRoles: an operation the table does not list is refused to everyone; this test
// makes adding one without deciding who may call it fail.
func TestEveryOperationHasRoles(t *testing.T) {
	reqs := requests()
	for _, op := range app.Operations() {
		if _, ok := Roles[op]; !ok {
			t.Errorf("operation %s is in no role's table", op)
		}
		if _, ok := reqs[op]; !ok {
			t.Errorf("operation %s has no request in this test", op)
		}
	}
	for op := range Roles {
		if _, ok := app.Lookup(op); !ok {
			t.Errorf("the table lists %s, which is no operation", op)
		}
	}
}

// TestFailClosed: every operation only operators may call that changes something, and
// bench.propose and workshop.submit, must not act unrecorded (app.FailsClosed): an operator's action changes authority.
func TestFailClosed(t *testing.T) {
	for op, roles := range Roles {
		o, _ := app.Lookup(op)
		req := o.New()
		if r, ok := req.(*app.VerifyRequest); ok {
			r.Repair = true // a repair changes the store; a check is a read
		}
		operatorOnly := len(roles) == 1 && roles[0] == app.Operator
		// workshop.submit records a version (an operator's) or makes a proposal (anyone else's).
		if want := (operatorOnly || op == "bench.propose" || op == "workshop.submit") && app.Audited(op, req); app.FailsClosed(op, req) != want {
			t.Errorf("%s: FailsClosed %v, want %v", op, !want, want)
		}
	}
	if app.FailsClosed("store.verify", &app.VerifyRequest{}) || app.Audited("store.verify", &app.VerifyRequest{}) {
		t.Errorf("store.verify without a repair is a read")
	}
}

// TestRolesAgainstEveryOperation runs every operation as every role: an operator, a user the record
// allows, another user, an agent. A refusal must be code "denied" and leave every file of the store,
// the records, the keys and the trust state as they were; what the table allows must not be
// refused by the policy.
func TestRolesAgainstEveryOperation(t *testing.T) {
	svc := newService(t)
	callers := []*app.Caller{
		{UID: 0, User: "root", Role: app.Operator, Dir: "/"},
		{UID: 1001, User: "alice", Role: app.User, Dir: "/"},
		{UID: 1002, User: "eve", Role: app.User, Dir: "/"},
		{UID: 0x70000000, User: "sandbox-1879048192", Role: app.Agent, Bench: "0123456789abcdef", Dir: "/"},
	}
	reqs := requests()
	// These are refused to users whatever the record says: they name files, grants or substituters.
	for _, op := range app.Operations() {
		for _, c := range callers {
			// Operators' successful calls change the store (that is what they are for); the check
			// is on refusals, so an operator's mutating calls run last on a copy of the request.
			before := snapshot(t, svc.Root)
			_, err := svc.Do(context.Background(), &app.Call{Caller: c}, op, reqs[op])
			denied := err != nil && app.Classify(err).Code == app.CodeDenied
			want := wantDenied(op, c)
			if denied != want {
				t.Errorf("%s as %s (%s): denied=%v, want %v (%v)", op, c.User, c.Role, denied, want, err)
			}
			if denied {
				if !errors.Is(err, app.ErrDenied) {
					t.Errorf("%s as %s: a refusal that is not ErrDenied: %v", op, c.User, err)
				}
				if app.Classify(err).Hint == "" {
					t.Errorf("%s as %s: a refusal without a hint: %v", op, c.User, err)
				}
				if after := snapshot(t, svc.Root); !maps(before, after) {
					t.Errorf("%s as %s: refused, yet the store changed", op, c.User)
				}
			}
		}
	}
	// The record is as it was made: nobody but an operator changed who may use it.
	v, err := records.Open(svc.Root).Current("tools")
	if err != nil || !slices.Equal(v.Users, []string{"nobody"}) {
		// The operator's workshop.allow (the one allowed call) set the user nobody; no other caller's did anything.
		t.Errorf("record after the run: %+v %v", v, err)
	}
}

// wantDenied is what the table and the field rules say, written out again by hand for the test.
func wantDenied(op string, c *app.Caller) bool {
	if c.Role == app.Operator {
		return false
	}
	if c.Role == app.Agent {
		return true // its Bench does not exist here: not even bench.propose
	}
	switch op {
	case "realize", "bench.run", "bench.create", "why":
		return c.User != "alice" // the record allows alice
	case "diff", "bench.ls", "workshop.ls", "workshop.show", "workshop.log", "workshop.diff", "key.show", "workshop.launchable",
		"snapshot.ls", "snapshot.rm", // their own (none here: an empty list, nothing removed)
		"workshop.submit", "workshop.tags", // a user's submit is a proposal; tags are read like a record's log
		"secret.add", "secret.ls", "secret.rm", "secret.update": // a user's own secrets (another's is not found, not denied)
		return false
	}
	return true // every other operation, and another user's Bench
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestFieldRules: the per-field rules, each on its own.
func TestFieldRules(t *testing.T) {
	svc := newService(t)
	alice := &app.Caller{User: "alice", Role: app.User}
	bob := &app.Caller{User: "bob", Groups: []string{"devs"}, Role: app.User}
	op := &app.Caller{User: "root", Role: app.Operator}
	for _, c := range []struct {
		who  *app.Caller
		op   string
		req  any
		want app.Code // "" allowed
	}{
		{alice, "realize", &app.RealizeRequest{Workshop: "tools"}, ""},
		{bob, "realize", &app.RealizeRequest{Workshop: "tools"}, ""}, // through @devs
		{alice, "realize", &app.RealizeRequest{Workshop: "tools", Substituters: []string{"oci://evil/x"}}, app.CodeDenied},
		{alice, "realize", &app.RealizeRequest{Workshop: "tools", Check: true}, app.CodeDenied},
		{alice, "realize", &app.RealizeRequest{Workshop: "/tmp/workshop.toml"}, app.CodeDenied},
		{alice, "realize", &app.RealizeRequest{}, app.CodeDenied},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", Grants: []string{"/etc:/x:ro"}}, app.CodeDenied},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", Substituters: []string{"oci://evil/x"}}, app.CodeDenied},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", MemoryBytes: 2 << 30}, app.CodeDenied},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", Pids: 101}, app.CodeDenied},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", MemoryBytes: 1 << 20, Pids: 10}, ""},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", Name: "../../etc"}, app.CodeUsage},
		{alice, "bench.run", &app.BenchRunRequest{Workshop: "tools", Net: "host"}, app.CodeUsage},
		{op, "bench.run", &app.BenchRunRequest{Workshop: "tools", Name: "Bad Name"}, app.CodeUsage},
		{op, "bench.run", &app.BenchRunRequest{Workshop: "tools", Grants: []string{"/srv:/x:rw"}, MemoryBytes: 8 << 30}, ""},
		{alice, "diff", &app.DiffRequest{A: "tools", B: "/etc/passwd"}, app.CodeDenied},
	} {
		err := Check(svc, c.who, c.op, c.req)
		got := app.Code("")
		if err != nil {
			got = app.Classify(err).Code
		}
		if got != c.want {
			t.Errorf("%s as %s: %+v: got %q (%v), want %q", c.op, c.who.User, c.req, got, err, c.want)
		}
		if err != nil && app.Classify(err).Hint == "" {
			t.Errorf("%s as %s: %+v: a refusal without a hint: %v", c.op, c.who.User, c.req, err)
		}
	}
}

// TestRecordNameTraversal: a record's name is a directory under the records, so a name that climbs
// out of them must never be read: a user plants a version.json that names itself, and a
// workshop.toml that links to a root-only file, and asks to be shown "version 1" of it.
func TestRecordNameTraversal(t *testing.T) {
	svc := newService(t)
	canary := "canary-" + fmt.Sprint(os.Getpid())
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(canary), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(t.TempDir(), "e")
	rel, _ := filepath.Rel(filepath.Join(svc.Root, "workshops"), planted)
	os.MkdirAll(filepath.Join(planted, "1"), 0o755)
	os.WriteFile(filepath.Join(planted, "1", "version.json"), []byte(fmt.Sprintf(`{"name":%q,"version":1}`, rel)), 0o644)
	os.Symlink(secret, filepath.Join(planted, "1", "workshop.toml"))
	alice := &app.Call{Caller: &app.Caller{User: "alice", Role: app.User}}
	for _, req := range []any{
		&app.WorkshopShowRequest{Name: rel, Version: 1},
		&app.WorkshopShowRequest{Name: rel},
		&app.WorkshopRequest{Name: rel},
		&app.WorkshopDiffRequest{Name: rel},
	} {
		op := map[string]string{"*app.WorkshopShowRequest": "workshop.show", "*app.WorkshopRequest": "workshop.log", "*app.WorkshopDiffRequest": "workshop.diff"}[fmt.Sprintf("%T", req)]
		res, err := svc.Do(context.Background(), alice, op, req)
		if err == nil || app.Classify(err).Code != app.CodeNotFound || strings.Contains(fmt.Sprintf("%+v %v", res, err), canary) {
			t.Errorf("%s %+v: %+v %v, want not_found and no secret", op, req, res, err)
		}
	}
}

// TestMetricsBounded: a request of many Benches' metrics is refused before any is looked up (each
// lookup reads every Bench's record).
func TestMetricsBounded(t *testing.T) {
	s := &app.Service{Root: t.TempDir(), Policy: Check}
	names := make([]string, 10_000)
	for i := range names {
		names[i] = fmt.Sprintf("b%d", i)
	}
	err := Check(s, &app.Caller{UID: 1001, User: "alice", Role: app.User}, "bench.metrics", &app.BenchMetricsRequest{Benches: names})
	if e := app.Classify(err); e == nil || e.Code != app.CodeUsage || !strings.Contains(e.Error(), "10000 Benches") {
		t.Errorf("10,000 Benches: %v, want a usage error", err)
	}
}

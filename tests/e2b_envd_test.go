package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestE2BEnvd drives envd's surface beyond commands and files through the real `e2b` SDK
// (testdata/e2b-envd.mjs): a pseudo-terminal (input, size, resize, reconnect, kill, a huge write), a
// recursive watch with entries (and watches of a missing directory, a file, a symlink to a host path
// and the whole tree), a polled watcher (entries, its end past 4096 events not taken), file metadata (written, read, listed, renamed, cleared by an overwrite) and a
// SIGTERM the command catches. One daemon, one record, one sandbox.
func TestE2BEnvd(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-envd.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-envd.mjs"))))
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}
	// A directory only the host has: a symlink to it in the Bench must lead nowhere.
	hostDir := t.TempDir()

	cmd := exec.Command("node", client, name, hostDir)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out, stderr.String())
	}
	steps := clientSteps(out)
	type step struct {
		OK    bool            `json:"ok"`
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	get := func(n string) step {
		t.Helper()
		var s step
		if err := json.Unmarshal(steps[n], &s); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out, stderr.String())
		}
		return s
	}
	ok := func(n string, wants ...string) {
		t.Helper()
		s := get(n)
		for _, want := range wants {
			if !s.OK || !strings.Contains(string(s.Value), want) {
				t.Errorf("%s: %+v (%s), want it to succeed with %s", n, s, s.Value, want)
			}
		}
	}
	fails := func(n string, wants ...string) {
		t.Helper()
		s := get(n)
		for _, want := range wants {
			if s.OK || !strings.Contains(s.Error, want) {
				t.Errorf("%s: %+v (%s), want an error with %q", n, s, s.Value, want)
			}
		}
	}
	ok("pty", `{"pid":true,"exit":0,"abc":true,"cols80":true,"cols100":true,"lines30":true,"tty":true,"second":true}`)
	ok("pty-huge", `"errors":["InvalidArgumentError: [invalid_argument] input of 2097152 bytes: at most 1048576 bytes a message; send it in parts",`+
		`"InvalidArgumentError: [invalid_argument] a request of `, `bytes: at most 4194304 bytes a message (at most 1048576 of input); send it in parts"]`,
		`"alive":true,"exit":0,"run":"ok\n"`)
	if s := get("pty-huge"); strings.Contains(string(s.Value), "accepted") {
		t.Errorf("pty-huge: a write over the bound was accepted: %s", s.Value)
	}
	ok("pty-kill", `{"killed":true,"end":"CommandExitError: signal: killed","again":false,"none":false}`)
	ok("watch", `"created":{"type":"create","name":"a.txt","entry":{"path":"/root/w/a.txt","type":"file"}}`,
		`"nested":{"type":"write","name":"sub/b.txt","entry":{"path":"/root/w/sub/b.txt","type":"file"}}`,
		`"removed":{"type":"remove","name":"a.txt"}`)
	fails("watch-missing", "FileNotFoundError", "/root/no-such-dir")
	fails("watch-file", "not a directory")
	fails("watch-escape", "FileNotFoundError")
	ok("watch-root", `"top":"watched"`, `"after":"ok\n"`)
	t.Logf("watch-root: %s", get("watch-root").Value)
	ok("watcher", `"created":{"name":"a.txt","entry":"/root/pw/a.txt"},"taken":4096,"end":"resource_exhausted: `,
		`more than 4096 events were not taken`, `"again":"resource_exhausted: `, `"stop":{},"gone":"not_found: `)
	ok("metadata", `{"written":{"author":"shed","purpose":"test"},"info":{"author":"shed","purpose":"test"},"listed":{"author":"shed","purpose":"test"},"moved":{"author":"shed","purpose":"test"},"over":null,"after":null}`)
	ok("sigterm", `{"status":200,"exit":7,"caught":true}`)
	ok("after", `"alive\n"`)
	if t.Failed() {
		t.Logf("client output:\n%s\n%s", out, stderr.String())
	}
}

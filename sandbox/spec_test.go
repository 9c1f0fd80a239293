package sandbox_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"toolshed.dev/shed/sandbox"
)

func validSpec() sandbox.Spec {
	return sandbox.Spec{
		Root: sandbox.Root{Lowers: []string{"/store/seed", "/store/layer"}, Upper: "/build/upper", Work: "/build/work"},
		Binds: []sandbox.Bind{
			{Source: "/store/debs", Target: "/run/in"},
			{Source: "/build/out", Target: "/run/out", Writable: true, IDs: sandbox.IDsSandbox},
		},
		Network: sandbox.Network{Listen: []string{"127.0.0.1:3128", "[::1]:8080", "127.0.0.2:0"}},
		Argv:    []string{"apt-get", "install", "-y"},
		Env:     []string{"PATH=/usr/bin:/bin", "EMPTY="},
		Dir:     "/tmp",
		UID:     1000,
		GID:     1000,
		Limits:  sandbox.Limits{MemoryBytes: 1 << 30, Pids: 100},
	}
}

func TestValidateAccepts(t *testing.T) {
	for name, edit := range map[string]func(*sandbox.Spec){
		"full":              func(*sandbox.Spec) {},
		"read-only overlay": func(s *sandbox.Spec) { s.Root.Upper, s.Root.Work = "", "" },
		"single lower":      func(s *sandbox.Spec) { s.Root = sandbox.Root{Lowers: []string{"/seed"}} },
		"host root":         func(s *sandbox.Spec) { s.Root = sandbox.Root{Host: true} },
		"absolute argv0":    func(s *sandbox.Spec) { s.Argv = []string{"/bin/true"} },
		"no env, no dir":    func(s *sandbox.Spec) { s.Env, s.Dir = nil, "" },
		"hostname":          func(s *sandbox.Spec) { s.Hostname = "bench-1.example" },
		"500 lowers":        func(s *sandbox.Spec) { s.Root.Lowers = lowers(500) },
		"bind file in /etc": func(s *sandbox.Spec) {
			s.Binds = []sandbox.Bind{{Source: "/x/resolv.conf", Target: "/etc/resolv.conf"}}
		},
		"target like /device": func(s *sandbox.Spec) { s.Binds = []sandbox.Bind{{Source: "/x", Target: "/device"}} },
		"no limits":           func(s *sandbox.Spec) { s.Limits = sandbox.Limits{} },
		"tmpfs upper": func(s *sandbox.Spec) {
			s.Root = sandbox.Root{Lowers: []string{"/seed"}, UpperTmpfs: true, UpperSize: 1 << 30}
		},
		"tmpfs upper, default size": func(s *sandbox.Spec) { s.Root = sandbox.Root{Lowers: []string{"/seed"}, UpperTmpfs: true} },
		"bind by descriptor":        func(s *sandbox.Spec) { s.Binds[0] = sandbox.Bind{SourceFD: os.Stdin, Target: "/run/in"} },
		"control":                   func(s *sandbox.Spec) { s.Control = "/var/lib/shed/benches/b1/control.sock" },
		"control beside upper":      func(s *sandbox.Spec) { s.Control = "/build/control.sock" },
	} {
		t.Run(name, func(t *testing.T) {
			s := validSpec()
			edit(&s)
			if err := s.Validate(); err != nil {
				t.Fatalf("got %v, want nil", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*sandbox.Spec)
		field string // the error must start with "field: "
		want  string // and contain this
	}{
		{"no root", func(s *sandbox.Spec) { s.Root = sandbox.Root{} }, "root", "one of host or lowers"},
		{"host and lowers", func(s *sandbox.Spec) { s.Root.Host = true }, "root", "exclusive"},
		{"host with upper", func(s *sandbox.Spec) { s.Root = sandbox.Root{Host: true, Upper: "/u", Work: "/w"} }, "root", "only with lowers"},
		{"too many lowers", func(s *sandbox.Spec) { s.Root.Lowers = lowers(501) }, "root.lowers", "at most 500"},
		{"relative lower", func(s *sandbox.Spec) { s.Root.Lowers[1] = "store/layer" }, "root.lowers[1]", "absolute"},
		{"empty lower", func(s *sandbox.Spec) { s.Root.Lowers[0] = "" }, "root.lowers[0]", "empty"},
		{"dotdot lower", func(s *sandbox.Spec) { s.Root.Lowers[1] = "/store/../etc" }, "root.lowers[1]", "clean"},
		{"trailing slash", func(s *sandbox.Spec) { s.Root.Lowers[0] = "/store/seed/" }, "root.lowers[0]", "clean"},
		{"double slash", func(s *sandbox.Spec) { s.Root.Lowers[0] = "/store//seed" }, "root.lowers[0]", "clean"},
		{"NUL in lower", func(s *sandbox.Spec) { s.Root.Lowers[0] = "/store/se\x00ed" }, "root.lowers[0]", "NUL"},
		{"upper without work", func(s *sandbox.Spec) { s.Root.Work = "" }, "root.work", "required"},
		{"work without upper", func(s *sandbox.Spec) { s.Root.Upper = "" }, "root.upper", "required"},
		{"relative upper", func(s *sandbox.Spec) { s.Root.Upper = "upper" }, "root.upper", "absolute"},
		{"relative work", func(s *sandbox.Spec) { s.Root.Work = "./work" }, "root.work", "absolute"},
		{"upper inside lower", func(s *sandbox.Spec) { s.Root.Upper = "/store/layer/upper" }, "root.upper", "root.lowers[1]"},
		{"upper is lower", func(s *sandbox.Spec) { s.Root.Upper = "/store/seed" }, "root.upper", "root.lowers[0]"},
		{"lower inside upper", func(s *sandbox.Spec) { s.Root.Lowers[0] = "/build/upper/seed" }, "root.upper", "root.lowers[0]"},
		{"work inside lower", func(s *sandbox.Spec) { s.Root.Work = "/store/seed/work" }, "root.work", "root.lowers[0]"},
		{"work inside upper", func(s *sandbox.Spec) { s.Root.Work = "/build/upper/work" }, "root.work", "overlap root.upper"},
		{"upper inside work", func(s *sandbox.Spec) { s.Root.Upper = "/build/work/upper" }, "root.work", "overlap root.upper"},
		{"relative bind source", func(s *sandbox.Spec) { s.Binds[1].Source = "out" }, "binds[1].source", "absolute"},
		{"relative bind target", func(s *sandbox.Spec) { s.Binds[1].Target = "run/out" }, "binds[1].target", "absolute"},
		{"unclean bind target", func(s *sandbox.Spec) { s.Binds[0].Target = "/run/../etc" }, "binds[0].target", "clean"},
		{"bind over root", func(s *sandbox.Spec) { s.Binds[0].Target = "/" }, "binds[0].target", "must not be /"},
		{"bind over proc", func(s *sandbox.Spec) { s.Binds[0].Target = "/proc" }, "binds[0].target", "under /proc"},
		{"bind under proc", func(s *sandbox.Spec) { s.Binds[0].Target = "/proc/sys/kernel" }, "binds[0].target", "under /proc"},
		{"bind under sys", func(s *sandbox.Spec) { s.Binds[1].Target = "/sys/fs/cgroup" }, "binds[1].target", "under /sys"},
		{"bind under dev", func(s *sandbox.Spec) { s.Binds[1].Target = "/dev/sda" }, "binds[1].target", "under /dev"},
		{"duplicate target", func(s *sandbox.Spec) { s.Binds[1].Target = "/run/in" }, "binds[1].target", "duplicate of binds[0]"},
		{"listen not loopback", func(s *sandbox.Spec) { s.Network.Listen[1] = "0.0.0.0:80" }, "network.listen[1]", "loopback"},
		{"listen public", func(s *sandbox.Spec) { s.Network.Listen[0] = "10.0.0.1:3128" }, "network.listen[0]", "loopback"},
		{"listen hostname", func(s *sandbox.Spec) { s.Network.Listen[0] = "localhost:3128" }, "network.listen[0]", "literal IP"},
		{"listen no port", func(s *sandbox.Spec) { s.Network.Listen[2] = "127.0.0.1" }, "network.listen[2]", "IP:port"},
		{"listen bad port", func(s *sandbox.Spec) { s.Network.Listen[0] = "127.0.0.1:70000" }, "network.listen[0]", "port"},
		{"listen named port", func(s *sandbox.Spec) { s.Network.Listen[0] = "127.0.0.1:http" }, "network.listen[0]", "port"},
		{"no argv", func(s *sandbox.Spec) { s.Argv = nil }, "argv", "empty"},
		{"empty argv0", func(s *sandbox.Spec) { s.Argv = []string{""} }, "argv[0]", "empty"},
		{"relative argv0 path", func(s *sandbox.Spec) { s.Argv = []string{"bin/sh"} }, "argv[0]", "without a slash"},
		{"unclean argv0", func(s *sandbox.Spec) { s.Argv = []string{"/bin/../bin/sh"} }, "argv[0]", "clean"},
		{"NUL in argv", func(s *sandbox.Spec) { s.Argv = []string{"sh", "-c", "a\x00b"} }, "argv[2]", "NUL"},
		{"env without =", func(s *sandbox.Spec) { s.Env = append(s.Env, "JUSTKEY") }, "env[2]", "KEY=VALUE"},
		{"env empty key", func(s *sandbox.Spec) { s.Env[0] = "=x" }, "env[0]", "KEY=VALUE"},
		{"env duplicate", func(s *sandbox.Spec) { s.Env = append(s.Env, "PATH=/x") }, "env[2]", "duplicate of env[0]"},
		{"env NUL", func(s *sandbox.Spec) { s.Env[1] = "EMPTY=\x00" }, "env[1]", "NUL"},
		{"relative dir", func(s *sandbox.Spec) { s.Dir = "tmp" }, "dir", "absolute"},
		{"hostname too long", func(s *sandbox.Spec) { s.Hostname = strings.Repeat("a", 65) }, "hostname", "64"},
		{"hostname slash", func(s *sandbox.Spec) { s.Hostname = "a/b" }, "hostname", "letters"},
		{"negative memory", func(s *sandbox.Spec) { s.Limits.MemoryBytes = -1 }, "limits.memoryBytes", "negative"},
		{"negative pids", func(s *sandbox.Spec) { s.Limits.Pids = -1 }, "limits.pids", "negative"},
		{"tmpfs upper with upper", func(s *sandbox.Spec) { s.Root.UpperTmpfs = true }, "root.upperTmpfs", "excludes upper and work"},
		{"tmpfs upper with host", func(s *sandbox.Spec) { s.Root = sandbox.Root{Host: true, UpperTmpfs: true} }, "root.upperTmpfs", "only with lowers"},
		{"tmpfs upper alone", func(s *sandbox.Spec) { s.Root = sandbox.Root{UpperTmpfs: true} }, "root", "one of host or lowers"},
		{"negative upper size", func(s *sandbox.Spec) {
			s.Root = sandbox.Root{Lowers: []string{"/seed"}, UpperTmpfs: true, UpperSize: -1}
		}, "root.upperSize", "negative"},
		{"upper size without tmpfs", func(s *sandbox.Spec) { s.Root.UpperSize = 1 << 20 }, "root.upperSize", "only with root.upperTmpfs"},
		{"writable bind with host ids", func(s *sandbox.Spec) { s.Binds[1].IDs = sandbox.IDsHost }, "binds[1].ids", "needs IDsSandbox or IDsOwner"},
		{"uid beyond the sandbox's", func(s *sandbox.Spec) { s.UID = 65536 }, "uid", "0 to 65535"},
		{"gid beyond the sandbox's", func(s *sandbox.Spec) { s.GID = 70000 }, "gid", "0 to 65535"},
		{"upper host ids without upper", func(s *sandbox.Spec) {
			s.Root = sandbox.Root{Lowers: []string{"/seed"}, UpperTmpfs: true, UpperHostIDs: true}
		}, "root.upperHostIDs", "only with root.upper"},
		{"bind source and fd", func(s *sandbox.Spec) { s.Binds[1].SourceFD = os.Stdin }, "binds[1].sourceFD", "excludes source"},
		{"bind without source", func(s *sandbox.Spec) { s.Binds[0].Source = "" }, "binds[0].source", "one of source and sourceFD"},
		{"relative control", func(s *sandbox.Spec) { s.Control = "control.sock" }, "control", "absolute"},
		{"long control", func(s *sandbox.Spec) { s.Control = "/" + strings.Repeat("c", 107) }, "control", "at most 107"},
		{"control in a lower", func(s *sandbox.Spec) { s.Control = "/store/layer/c.sock" }, "control", "inside root.lowers[1]"},
		{"control in upper", func(s *sandbox.Spec) { s.Control = "/build/upper/c.sock" }, "control", "inside root.upper"},
		{"control in work", func(s *sandbox.Spec) { s.Control = "/build/work/c.sock" }, "control", "inside root.work"},
		{"control in a bind source", func(s *sandbox.Spec) { s.Control = "/build/out/c.sock" }, "control", "inside binds[1].source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			s.Root.Lowers = append([]string(nil), s.Root.Lowers...)
			s.Binds = append([]sandbox.Bind(nil), s.Binds...)
			s.Network.Listen = append([]string(nil), s.Network.Listen...)
			s.Env = append([]string(nil), s.Env...)
			tc.edit(&s)
			err := s.Validate()
			if err == nil {
				t.Fatalf("got nil, want an error about %s", tc.field)
			}
			var se *sandbox.SpecError
			if !errors.As(err, &se) || se.Field != tc.field {
				t.Fatalf("got %v (field %q), want field %q", err, fieldOf(se), tc.field)
			}
			if !strings.HasPrefix(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %q, want %q... containing %q", err, tc.field+": ", tc.want)
			}
		})
	}
}

func fieldOf(se *sandbox.SpecError) string {
	if se == nil {
		return ""
	}
	return se.Field
}

func lowers(n int) []string {
	ls := make([]string, n)
	for i := range ls {
		ls[i] = fmt.Sprintf("/store/l%d", i)
	}
	return ls
}

func TestSetupErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		e    sandbox.SetupError
		want string
	}{
		{sandbox.SetupError{Op: "mount overlay", Path: "/s/a", Detail: "lowerdir+ root.lowers[0]", Err: errors.New("no such file or directory")},
			"sandbox: mount overlay /s/a: lowerdir+ root.lowers[0]: no such file or directory"},
		{sandbox.SetupError{Op: "pivot_root"}, "sandbox: pivot_root"},
		{sandbox.SetupError{Op: "exec", Path: "sh", Err: errors.New("x")}, "sandbox: exec sh: x"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

func TestExecRequestValidate(t *testing.T) {
	ok := sandbox.ExecRequest{Argv: []string{"sh", "-c", "true"}, Env: []string{"PATH=/bin"}, Dir: "/root", UID: 1000}
	if err := ok.Validate(); err != nil {
		t.Fatalf("got %v, want nil", err)
	}
	for _, tc := range []struct {
		req   sandbox.ExecRequest
		field string
	}{
		{sandbox.ExecRequest{}, "argv"},
		{sandbox.ExecRequest{Argv: []string{"bin/sh"}}, "argv[0]"},
		{sandbox.ExecRequest{Argv: []string{"sh", "a\x00"}}, "argv[1]"},
		{sandbox.ExecRequest{Argv: []string{"sh"}, Env: []string{"A=1", "A=2"}}, "env[1]"},
		{sandbox.ExecRequest{Argv: []string{"sh"}, Dir: "root"}, "dir"},
	} {
		var se *sandbox.SpecError
		if err := tc.req.Validate(); !errors.As(err, &se) || se.Field != tc.field {
			t.Errorf("%+v: got %v, want a SpecError on %s", tc.req, err, tc.field)
		}
	}
}

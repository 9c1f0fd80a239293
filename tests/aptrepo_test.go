package tests

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// aptRepo is a local, signed apt repository served over loopback: real
// .debs made with dpkg-deb, indexes with apt-ftparchive, signed with gpg.
// It is how the tests make packages that misbehave.
type aptRepo struct {
	dir    string // served directory: pool/ and dists/
	key    string // the armored public key that signs it
	url    string
	server *httptest.Server
	base   string   // work directory: package sources, gnupg home
	genv   []string // GNUPGHOME for gpg
}

// debSpec is one package of the repository.
type debSpec struct {
	name, version string
	depends       string
	files         map[string]string // path in the package → content
	modes         map[string]os.FileMode
	symlinks      map[string]string // path → target
	postinst      string            // shell script body, run by dpkg
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func newAptRepo(t *testing.T, debs ...debSpec) *aptRepo {
	t.Helper()
	for _, tool := range []string{"dpkg-deb", "apt-ftparchive", "gpg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (apt-get install dpkg-dev apt-utils gpg): `make deps` installs it", tool)
		}
	}
	base := t.TempDir()
	repo := &aptRepo{dir: filepath.Join(base, "repo")}
	gnupg := filepath.Join(base, "gnupg")
	os.MkdirAll(gnupg, 0o700)
	genv := []string{"GNUPGHOME=" + gnupg}
	run(t, base, genv, "gpg", "--batch", "--passphrase", "", "--quick-gen-key", "shed test repo <test@localhost>", "ed25519", "sign", "never")
	repo.base, repo.genv = base, genv
	repo.add(t, debs...)
	key, err := exec.Command("gpg", "--homedir", gnupg, "--armor", "--export").Output()
	if err != nil || len(key) == 0 {
		t.Fatalf("export key: %v", err)
	}
	repo.key = writeFile(t, filepath.Join(base, "repo.asc"), string(key))
	repo.server = httptest.NewServer(http.FileServer(http.Dir(repo.dir)))
	t.Cleanup(repo.server.Close)
	repo.url = repo.server.URL
	return repo
}

// add builds packages into the pool and publishes new signed indexes.
func (repo *aptRepo) add(t *testing.T, debs ...debSpec) {
	t.Helper()
	base, genv := repo.base, repo.genv
	pool := filepath.Join(repo.dir, "pool", "main")
	os.MkdirAll(pool, 0o755)
	for _, d := range debs {
		src := filepath.Join(base, "src", d.name)
		os.RemoveAll(src)
		control := fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: shed tests <test@localhost>\nDescription: %s test package\n", d.name, d.version, d.name)
		if d.depends != "" {
			control += "Depends: " + d.depends + "\n"
		}
		writeFile(t, filepath.Join(src, "DEBIAN", "control"), control)
		if d.postinst != "" {
			writeFile(t, filepath.Join(src, "DEBIAN", "postinst"), "#!/bin/sh\nset -e\n"+d.postinst+"\n")
			os.Chmod(filepath.Join(src, "DEBIAN", "postinst"), 0o755)
		}
		for p, c := range d.files {
			writeFile(t, filepath.Join(src, p), c)
			if m, ok := d.modes[p]; ok {
				os.Chmod(filepath.Join(src, p), m)
			}
		}
		for p, target := range d.symlinks {
			os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755)
			if err := os.Symlink(target, filepath.Join(src, p)); err != nil {
				t.Fatal(err)
			}
		}
		run(t, base, nil, "dpkg-deb", "--root-owner-group", "--build", src, filepath.Join(pool, fmt.Sprintf("%s_%s_all.deb", d.name, d.version)))
	}
	dists := filepath.Join(repo.dir, "dists", "stable")
	os.MkdirAll(filepath.Join(dists, "main", "binary-amd64"), 0o755)
	os.Remove(filepath.Join(dists, "Release"))
	os.Remove(filepath.Join(dists, "InRelease"))
	out, err := exec.Command("sh", "-c", "cd "+repo.dir+" && apt-ftparchive packages pool").Output()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dists, "main", "binary-amd64", "Packages"), string(out))
	rel, err := exec.Command("apt-ftparchive",
		"-o", "APT::FTPArchive::Release::Suite=stable", "-o", "APT::FTPArchive::Release::Codename=stable",
		"-o", "APT::FTPArchive::Release::Architectures=amd64", "-o", "APT::FTPArchive::Release::Components=main",
		"release", dists).Output()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dists, "Release"), string(rel))
	run(t, dists, genv, "gpg", "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", "", "--clearsign", "-o", "InRelease", "Release")
}

// recipe writes a Workshop using the Debian seed plus this repository.
func (r *aptRepo) recipe(t *testing.T, dir, name string, packages ...string) string {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	key := filepath.Join(dir, "repo.asc")
	b, _ := os.ReadFile(r.key)
	writeFile(t, key, string(b))
	quoted := make([]string, len(packages))
	for i, p := range packages {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return writeFile(t, filepath.Join(dir, "workshop.toml"), fmt.Sprintf(`name = %q
seed = "debian/bookworm"
[apt]
packages = [%s]
[[apt.source]]
url = %q
suite = "stable"
components = ["main"]
key = "repo.asc"
`, name, strings.Join(quoted, ", "), r.url))
}

func (r *aptRepo) debFile(name, version string) string {
	return filepath.Join(r.dir, "pool", "main", fmt.Sprintf("%s_%s_all.deb", name, version))
}

// TestLocalRepository covers the failure cases on packages we control: a hash
// mismatch, a version the mirror no longer serves, an unsigned repository.
func TestLocalRepository(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	repo := newAptRepo(t,
		debSpec{name: "hello-shed", version: "1.0", depends: "dep-shed", files: map[string]string{"usr/bin/hello-shed": "#!/bin/sh\necho hello from shed\n"}, modes: map[string]os.FileMode{"usr/bin/hello-shed": 0o755}},
		debSpec{name: "dep-shed", version: "2.0", files: map[string]string{"usr/share/dep-shed/data": "dep\n"}},
	)
	dir := t.TempDir()
	file := repo.recipe(t, dir, "local", "hello-shed")
	j := realize(t, root, file)
	if b, err := os.ReadFile(filepath.Join(j.Layers[1], "usr/bin/hello-shed")); err != nil || !strings.Contains(string(b), "hello from shed") {
		t.Fatalf("hello-shed not in the layer: %v", err)
	}
	lock, _ := os.ReadFile(filepath.Join(dir, "workshop.lock"))
	if !strings.Contains(string(lock), "name = 'dep-shed'") || !strings.Contains(string(lock), repo.url) {
		t.Errorf("lock lacks the dependency from the local repository:\n%s", lock)
	}
	r := mustShed(t, root, "why", file, "/usr/share/dep-shed/data")
	if !strings.Contains(r.stdout, "needed by: hello-shed → dep-shed") {
		t.Errorf("why:\n%s", r.stdout)
	}

	t.Run("hash mismatch stores nothing", func(t *testing.T) {
		fresh := seededRoot(t) // the seed substituted: these are about the .debs
		// Realize the seed and the lock's packages in a fresh store, with one
		// .deb on the server swapped for other bytes.
		deb := repo.debFile("dep-shed", "2.0")
		good, _ := os.ReadFile(deb)
		os.WriteFile(deb, append(append([]byte(nil), good...), 0), 0o644)
		defer os.WriteFile(deb, good, 0o644)
		r := shed(t, fresh, nil, "realize", file)
		if r.code != 1 {
			t.Fatalf("realize with a tampered .deb: exit %d, want 1\n%s", r.code, r.stderr)
		}
		for _, want := range []string{"hash mismatch", repo.url + "/pool/main/dep-shed_2.0_all.deb", "dep-shed"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("error lacks %q:\n%s", want, r.stderr)
			}
		}
		if ls := mustShed(t, fresh, "store", "ls").stdout; regexp.MustCompile(`dep-shed_2\.0_all\.deb\s`).MatchString(ls) {
			t.Errorf("the tampered .deb is in the store:\n%s", ls)
		}
		mustShed(t, fresh, "store", "verify", "--check-contents")
		os.WriteFile(deb, good, 0o644)
		realize(t, fresh, file) // the cause is gone: a rerun succeeds
	})

	t.Run("version no longer served", func(t *testing.T) {
		deb := repo.debFile("dep-shed", "2.0")
		good, _ := os.ReadFile(deb)
		os.Remove(deb)
		defer os.WriteFile(deb, good, 0o644)
		// A store that has the .deb still realizes (here: rebuilds the
		// layer from it after gc took the layer).
		mustShed(t, root, "root", "rm", "local")
		mustShed(t, root, "root", "add", "keep-seed", j.Layers[0])
		defer mustShed(t, root, "root", "rm", "keep-seed")
		for _, f := range j.Fetched {
			if strings.Contains(f, "dep-shed") {
				mustShed(t, root, "root", "add", "keep-dep", f)
			}
		}
		mustShed(t, root, "gc")
		again := realize(t, root, file)
		if len(again.Built) != 1 || len(again.Fetched) != 1 {
			t.Errorf("rebuild: built %v fetched %v; want the layer rebuilt and only hello-shed fetched", again.Built, again.Fetched)
		}
		mustShed(t, root, "root", "rm", "keep-dep")
		// A store that lacks it fails, naming the package and version.
		fresh := seededRoot(t) // the seed substituted: these are about the .debs
		r := shed(t, fresh, nil, "realize", file)
		if r.code != 1 {
			t.Fatalf("exit %d, want 1\n%s", r.code, r.stderr)
		}
		for _, want := range []string{"dep-shed 2.0", "no longer served", "shed: hint:"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("error lacks %q:\n%s", want, r.stderr)
			}
		}
	})

	t.Run("lock is kept until --update", func(t *testing.T) {
		// The repository publishes a new version: the lock keeps the old
		// one (a lock that matches the recipe is reused) until --update.
		repo.add(t, debSpec{name: "hello-shed", version: "1.1", depends: "dep-shed", files: map[string]string{"usr/bin/hello-shed": "#!/bin/sh\necho hello 1.1\n"}, modes: map[string]os.FileMode{"usr/bin/hello-shed": 0o755}})
		r := mustShed(t, root, "lock", file)
		if !strings.Contains(r.stdout, "is up to date") {
			t.Errorf("lock of an unchanged recipe: %s", r.stdout)
		}
		if r := shed(t, root, nil, "lock", "--update", "-f", file, "not-declared"); r.code != 2 {
			t.Errorf("--update of a package the recipe does not declare: exit %d, want 2\n%s", r.code, r.stderr)
		}
		r = mustShed(t, root, "lock", "--update", "-f", file, "hello-shed")
		if !strings.Contains(r.stdout, "~ hello-shed 1.0 → 1.1") {
			t.Errorf("lock --update hello-shed:\n%s", r.stdout)
		}
		j := realize(t, root, file)
		if b, _ := os.ReadFile(filepath.Join(j.Layers[1], "usr/bin/hello-shed")); !strings.Contains(string(b), "hello 1.1") {
			t.Errorf("the layer does not have hello-shed 1.1: %q", b)
		}
		// diff speaks of declarations and resolved packages, not files.
		other := repo.recipe(t, t.TempDir(), "local", "hello-shed", "dep-shed")
		mustShed(t, root, "lock", other)
		d := mustShed(t, root, "diff", file, other)
		if !strings.Contains(d.stdout, "+ apt.packages: dep-shed") {
			t.Errorf("diff:\n%s", d.stdout)
		}
	})

	t.Run("unsigned repository refused", func(t *testing.T) {
		other := newAptRepo(t, debSpec{name: "unsigned-shed", version: "1", files: map[string]string{"etc/unsigned": "x"}})
		// Sign nothing: drop InRelease so apt finds only an unsigned Release.
		os.Remove(filepath.Join(other.dir, "dists", "stable", "InRelease"))
		d := t.TempDir()
		f := other.recipe(t, d, "unsigned", "unsigned-shed")
		r := shed(t, root, nil, "lock", f)
		if r.code == 0 {
			t.Fatalf("lock of an unsigned repository succeeded:\n%s", r.stdout)
		}
		if !strings.Contains(r.stderr, "not signed") && !strings.Contains(r.stderr, "Release") {
			t.Errorf("error does not say the repository is unsigned:\n%s", r.stderr)
		}
		if _, err := os.Stat(filepath.Join(d, "workshop.lock")); err == nil {
			t.Error("a lock was written")
		}
	})
}

// TestHostilePackages: maintainer scripts that make device nodes, write
// through symlinks, ship setuid files or try the network.
func TestHostilePackages(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	// A host-side server the network test would reach if it could.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var hits atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			hits.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	hostDir := t.TempDir() // exists on the host, not in any sandbox
	before, err := os.Stat(hostDir)
	if err != nil {
		t.Fatal(err)
	}
	repo := newAptRepo(t,
		debSpec{name: "hostile-dev", version: "1", postinst: "mkdir -p /var/lib/hostile-dev\nif mknod /usr/share/evil-null c 1 3; then echo made; else echo refused; fi > /var/lib/hostile-dev/result"},
		debSpec{name: "hostile-net", version: "1", postinst: fmt.Sprintf(
			"mkdir -p /var/lib/hostile-net\nif perl -MIO::Socket::INET -e 'exit(IO::Socket::INET->new(PeerAddr=>\"127.0.0.1:%d\",Timeout=>3)?0:1)'; then echo reached > /var/lib/hostile-net/result; else echo unreachable > /var/lib/hostile-net/result; fi", port)},
		debSpec{name: "hostile-random", version: "1", postinst: "mkdir -p /var/lib/hostile-random\nod -An -N8 -tx8 /dev/urandom > /var/lib/hostile-random/value"},
		debSpec{name: "hostile-setuid", version: "1", files: map[string]string{"usr/bin/hostile-su": "#!/bin/sh\n"}, modes: map[string]os.FileMode{"usr/bin/hostile-su": 0o755 | os.ModeSetuid}},
		debSpec{name: "capped", version: "1", depends: "libcap2-bin, acl",
			files:    map[string]string{"usr/bin/capped": "#!/bin/sh\n", "usr/share/capped/file": "x\n"},
			modes:    map[string]os.FileMode{"usr/bin/capped": 0o755},
			postinst: "setcap cap_net_raw+ep /usr/bin/capped\nsetfacl -m u:1234:r /usr/share/capped/file"},
		debSpec{name: "hostile-link", version: "1",
			symlinks: map[string]string{"usr/share/hostile-link/etc": "/etc", "usr/share/hostile-link/host": hostDir},
			postinst: "echo pwned > /usr/share/hostile-link/etc/hostile-was-here\nln -s " + hostDir + " /var/lib/hostile-link-out"},
	)
	dir := t.TempDir()

	t.Run("no device node", func(t *testing.T) {
		// Root of a build's user namespace cannot make one (mknod needs CAP_MKNOD over the host);
		// a layer that held one anyway would be refused at capture (builder's TestNormalizeRefuses).
		f := repo.recipe(t, filepath.Join(dir, "dev"), "hostile-dev", "hostile-dev")
		j := realize(t, root, f)
		if b, err := os.ReadFile(filepath.Join(j.Layers[1], "var/lib/hostile-dev/result")); err != nil || strings.TrimSpace(string(b)) != "refused" {
			t.Errorf("postinst mknod: %q, %v; want refused", b, err)
		}
		if _, err := os.Lstat(filepath.Join(j.Layers[1], "usr/share/evil-null")); err == nil {
			t.Error("the layer holds the device node")
		}
		mustShed(t, root, "store", "verify")
	})
	t.Run("no network in a build", func(t *testing.T) {
		f := repo.recipe(t, filepath.Join(dir, "net"), "hostile-net", "hostile-net")
		j := realize(t, root, f)
		b, err := os.ReadFile(filepath.Join(j.Layers[1], "var/lib/hostile-net/result"))
		if err != nil || strings.TrimSpace(string(b)) != "unreachable" {
			t.Errorf("postinst network result %q, %v; want unreachable", b, err)
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the host-side server saw %d connections from a build", n)
		}
	})
	t.Run("check finds a build that is not reproducible", func(t *testing.T) {
		f := repo.recipe(t, filepath.Join(dir, "random"), "hostile-random", "hostile-random")
		realize(t, root, f)
		r := shed(t, root, nil, "realize", "--check", f)
		if r.code != 4 {
			t.Fatalf("realize --check of a random postinst: exit %d, want 4\n%s", r.code, r.stderr)
		}
		for _, want := range []string{"content DIFFERS", "var/lib/hostile-random/value: content differs", "is not reproducible"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("--check output lacks %q:\n%s", want, r.stderr)
			}
		}
	})
	t.Run("file capabilities and ACLs kept", func(t *testing.T) {
		// Set by the build's root, in its user namespace, through the idmapped upper: stored as host
		// root's would be (a version 2 capability, no namespace root id; the ACL's uid as is).
		f := repo.recipe(t, filepath.Join(dir, "cap"), "capped", "capped")
		j := realize(t, root, f)
		layer := j.Layers[len(j.Layers)-1]
		buf := make([]byte, 64)
		n, err := unix.Lgetxattr(filepath.Join(layer, "usr/bin/capped"), "security.capability", buf)
		if err != nil || n != 20 || binary.LittleEndian.Uint32(buf) != 0x02000001 || binary.LittleEndian.Uint32(buf[4:])&(1<<13) == 0 {
			t.Errorf("security.capability on disk: % x, %v; want version 2, effective, cap_net_raw", buf[:max(n, 0)], err)
		}
		n, err = unix.Lgetxattr(filepath.Join(layer, "usr/share/capped/file"), "system.posix_acl_access", buf)
		if err != nil || !aclHasUser(buf[:max(n, 0)], 1234) {
			t.Errorf("system.posix_acl_access on disk: % x, %v; want an entry for user 1234", buf[:max(n, 0)], err)
		}
		mustShed(t, root, "store", "verify", "--check-contents")
		r := mustShed(t, root, "bench", "run", "--offline", "-f", f, "--", "sh", "-c", "getcap /usr/bin/capped; getfacl -cn /usr/share/capped/file")
		if !strings.Contains(r.stdout, "/usr/bin/capped cap_net_raw=ep") || !strings.Contains(r.stdout, "user:1234:r--") {
			t.Errorf("in a Bench:\n%s%s", r.stdout, r.stderr)
		}
	})
	t.Run("setuid kept, symlink not followed out", func(t *testing.T) {
		f := repo.recipe(t, filepath.Join(dir, "su"), "hostile-su", "hostile-setuid", "hostile-link")
		j := realize(t, root, f)
		fi, err := os.Lstat(filepath.Join(j.Layers[1], "usr/bin/hostile-su"))
		if err != nil || fi.Mode()&os.ModeSetuid == 0 {
			t.Errorf("setuid file: %v %v; want the bit kept in the store (Benches mount layers nosuid)", fi, err)
		}
		if _, err := os.Stat("/etc/hostile-was-here"); err == nil {
			os.Remove("/etc/hostile-was-here")
			t.Error("a maintainer script wrote /etc/hostile-was-here on the host through a symlink")
		}
		// The write went into the sandbox's own /etc: captured in the layer.
		if _, err := os.Stat(filepath.Join(j.Layers[1], "etc/hostile-was-here")); err != nil {
			t.Errorf("the write through the symlink is not in the layer: %v", err)
		}
		// Capture (clamping times, hashing) never followed the links that
		// point at a host directory: its mtime and contents are untouched.
		after, err := os.Stat(hostDir)
		if err != nil || !after.ModTime().Equal(before.ModTime()) {
			t.Errorf("host directory behind a symlink changed: %v → %v (%v)", before.ModTime(), after.ModTime(), err)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 0 {
			t.Errorf("host directory behind a symlink has %d entries", len(ents))
		}
	})
}

// aclHasUser reports whether an xattr-encoded POSIX ACL has an ACL_USER entry for uid.
func aclHasUser(b []byte, uid uint32) bool {
	if len(b) < 4 {
		return false
	}
	for e := b[4:]; len(e) >= 8; e = e[8:] {
		if binary.LittleEndian.Uint16(e) == 2 && binary.LittleEndian.Uint32(e[4:]) == uid { // ACL_USER
			return true
		}
	}
	return false
}

package recipe_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"toolshed.dev/shed/recipe"
)

// bad is an input that must be refused with exactly msg; hint, if set, must
// appear in the error's hint.
type bad struct {
	in, msg, hint string
}

// checkErr asserts that err is a *recipe.Error with message msg and a hint
// containing hint.
func checkErr(t *testing.T, in string, err error, msg, hint string) {
	t.Helper()
	if err == nil {
		t.Errorf("%q: got no error, want %q", in, msg)
		return
	}
	var e *recipe.Error
	if !errors.As(err, &e) {
		t.Errorf("%q: got %T %v, want *recipe.Error", in, err, err)
		return
	}
	if !errors.Is(err, recipe.ErrInvalid) {
		t.Errorf("%q: errors.Is(err, ErrInvalid) is false", in)
	}
	if e.Msg != msg {
		t.Errorf("%q: got message %q, want %q", in, e.Msg, msg)
	}
	if e.Hint == "" || !strings.Contains(e.Hint, hint) {
		t.Errorf("%q: got hint %q, want one containing %q", in, e.Hint, hint)
	}
	// Lowercase, except for an acronym such as URL or OCI.
	first, _, _ := strings.Cut(e.Msg, " ")
	if strings.HasSuffix(e.Msg, ".") || first != "" && first[0] >= 'A' && first[0] <= 'Z' && strings.ToUpper(first) != first {
		t.Errorf("%q: message %q is not lowercase without a trailing period", in, e.Msg)
	}
}

func TestParseAptPackage(t *testing.T) {
	good := []struct {
		in   string
		want recipe.AptPackage
	}{
		{"jq", recipe.AptPackage{Name: "jq"}},
		{"curl=7.88.1-10+deb12u5", recipe.AptPackage{Name: "curl", Version: "7.88.1-10+deb12u5"}},
		{"libstdc++6", recipe.AptPackage{Name: "libstdc++6"}},
		{"python3.11", recipe.AptPackage{Name: "python3.11"}},
		{"0ad", recipe.AptPackage{Name: "0ad"}},
		{"vim=2:9.0.1378-2~bpo12+1", recipe.AptPackage{Name: "vim", Version: "2:9.0.1378-2~bpo12+1"}},
	}
	for _, tc := range good {
		got, err := recipe.ParseAptPackage(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q: (-want +got)\n%s", tc.in, diff)
		}
		if got.String() != tc.in {
			t.Errorf("%q: String() = %q", tc.in, got.String())
		}
	}
	for _, tc := range []bad{
		{"", "empty package name", "name=VERSION"},
		{"-oAPT::Get::AllowUnauthenticated=true", `"-oAPT::Get::AllowUnauthenticated=true" is an option, not a package`, "options are not allowed"},
		{"--allow-unauthenticated", `"--allow-unauthenticated" is an option, not a package`, "options are not allowed"},
		{"~T", `"~T" is an apt pattern, not a package name`, "patterns are not allowed"},
		{"?true", `"?true" is an apt pattern, not a package name`, "patterns are not allowed"},
		{"../x", `"../x" is a path, glob or release selector, not a package name`, "local .deb files"},
		{"./x.deb", `"./x.deb" is a path, glob or release selector, not a package name`, "local .deb files"},
		{"jq/bookworm-backports", `"jq/bookworm-backports" is a path, glob or release selector, not a package name`, "release selectors"},
		{"lib*", `"lib*" is a path, glob or release selector, not a package name`, "globs"},
		{"pkg=1.0 evil", `"pkg=1.0 evil" has a space`, "one package per string"},
		{"jq curl", `"jq curl" has a space`, "one package per string"},
		{"jq=-1", `version "-1" starts with '-'`, "name=VERSION"},
		{"jq=", "empty version after '='", "name=VERSION"},
		{"jq==1.6", `"jq==1.6" pins with '=='`, "single '='"},
		{"jq=1.6!", `invalid version "1.6!"`, "letters, digits"},
		{"jq:amd64", `"jq:amd64" has an architecture qualifier`, "architecture"},
		{"JQ", `invalid package name "JQ"`, `write "jq"`},
		{"j", `invalid package name "j"`, "at least 2 characters"},
		{"+x", `invalid package name "+x"`, "starting with a letter or digit"},
		{"jq-t\u043e\u043els", "non-ASCII character U+043E at byte 4", "homoglyph"},
		{"jq\u202Eslt", "non-ASCII character U+202E at byte 2", "right-to-left override"},
		{"j\u200Bq", "non-ASCII character U+200B at byte 1", "zero width space"},
		{"\uFEFFjq", "non-ASCII character U+FEFF at byte 0", "invisible"},
		{"jq\n", "control character U+000A at byte 2", "printable ASCII"},
		{"jq\x00", "control character U+0000 at byte 2", "printable ASCII"},
		{"jq\xff", "invalid UTF-8 byte 0xff at byte 2", "printable ASCII"},
	} {
		_, err := recipe.ParseAptPackage(tc.in)
		checkErr(t, tc.in, err, tc.msg, tc.hint)
	}
}

func TestParsePipPackage(t *testing.T) {
	good := []struct {
		in   string
		want recipe.PipPackage
	}{
		{"attrs", recipe.PipPackage{Name: "attrs"}},
		{"requests==2.31.0", recipe.PipPackage{Name: "requests", Version: "2.31.0"}},
		{"Django==4.2.7", recipe.PipPackage{Name: "Django", Version: "4.2.7"}},
		{"zope.interface==6.1", recipe.PipPackage{Name: "zope.interface", Version: "6.1"}},
		{"typing_extensions==4.9.0", recipe.PipPackage{Name: "typing_extensions", Version: "4.9.0"}},
		{"x==1!2.0rc1.post3.dev4+local.7", recipe.PipPackage{Name: "x", Version: "1!2.0rc1.post3.dev4+local.7"}},
		{"a", recipe.PipPackage{Name: "a"}},
	}
	for _, tc := range good {
		got, err := recipe.ParsePipPackage(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q: (-want +got)\n%s", tc.in, diff)
		}
		if got.String() != tc.in {
			t.Errorf("%q: String() = %q", tc.in, got.String())
		}
	}
	for _, tc := range []bad{
		{"", "empty package name", "name==VERSION"},
		{"--index-url", `"--index-url" is a pip option, not a requirement`, "[pip] index"},
		{"--index-url=https://evil.example/simple", `"--index-url=https://evil.example/simple" is a pip option, not a requirement`, "[pip] index"},
		{"--extra-index-url", `"--extra-index-url" is a pip option, not a requirement`, "options"},
		{"--trusted-host", `"--trusted-host" is a pip option, not a requirement`, "options"},
		{"-i", `"-i" is a pip option, not a requirement`, "options"},
		{"-e .", `"-e ." is a pip option, not a requirement`, "options"},
		{"-r req.txt", `"-r req.txt" is a pip option, not a requirement`, "options"},
		{"requests @ https://x/y.whl", `"requests @ https://x/y.whl" is a URL or direct reference, not a requirement`, "URLs belong to the index setting"},
		{"https://x/y.whl", `"https://x/y.whl" is a URL or direct reference, not a requirement`, "URLs belong to the index setting"},
		{"git+https://github.com/x/y", `"git+https://github.com/x/y" is a URL or direct reference, not a requirement`, "name==VERSION"},
		{`requests; python_version<"3"`, `"requests; python_version<\"3\"" has an environment marker`, "markers are not allowed"},
		{"requests[socks]", `"requests[socks]" requests extras`, "extras are not allowed"},
		{"requests>=2", `version operator ">=" is not allowed`, "name==VERSION"},
		{"requests~=2.0", `version operator "~=" is not allowed`, "name==VERSION"},
		{"requests!=2.0", `version operator "!=" is not allowed`, "name==VERSION"},
		{"requests===2.0", `version operator "===" is not allowed`, "name==VERSION"},
		{"requests<3", `version operator "<" is not allowed`, "name==VERSION"},
		{"requests=2.0", `version operator "=" is not allowed`, "name==VERSION"},
		{"requests==", "empty version after '=='", "name==VERSION"},
		{"requests==2.*", `wildcard version "2.*" is not allowed`, "one exact version"},
		{"requests==v2.0", `invalid version "v2.0"`, "starts with a digit"},
		{"requests==2.0-", `invalid version "2.0-"`, "starts with a digit"},
		{"requests==2.0,<3", `invalid version "2.0,<3"`, "starts with a digit"},
		{"requests == 2.0", `"requests == 2.0" has a space`, "no spaces"},
		{"./pkg", `"./pkg" is a path, not a requirement`, "local files"},
		{"_x", `invalid package name "_x"`, "starting and ending with a letter or digit"},
		{"x-", `invalid package name "x-"`, "starting and ending with a letter or digit"},
		{"r\u0435quests", "non-ASCII character U+0435 at byte 1", "homoglyph"},
		{"requests\u200B", "non-ASCII character U+200B at byte 8", "zero width space"},
		{"requests\u202E", "non-ASCII character U+202E at byte 8", "right-to-left override"},
	} {
		_, err := recipe.ParsePipPackage(tc.in)
		checkErr(t, tc.in, err, tc.msg, tc.hint)
	}
}

func TestNormalizePipName(t *testing.T) {
	for in, want := range map[string]string{
		"requests":          "requests",
		"Requests":          "requests",
		"typing_extensions": "typing-extensions",
		"Zope.Interface":    "zope-interface",
		"a-_.-b":            "a-b",
		"A__B..C--D":        "a-b-c-d",
	} {
		if got := recipe.NormalizePipName(in); got != want {
			t.Errorf("NormalizePipName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseHost(t *testing.T) {
	good := []struct {
		in   string
		want recipe.Host
	}{
		{"api.github.com", recipe.Host{Name: "api.github.com"}},
		{"example.org:8443", recipe.Host{Name: "example.org", Port: 8443}},
		{"xn--bcher-kva.example", recipe.Host{Name: "xn--bcher-kva.example"}},
		{"a-b.c0", recipe.Host{Name: "a-b.c0"}},
		{"8.8.8.8", recipe.Host{Name: "8.8.8.8"}},
		{"1.1.1.1:53", recipe.Host{Name: "1.1.1.1", Port: 53}},
		{"2606:4700:4700::1111", recipe.Host{Name: "2606:4700:4700::1111"}},
		{"[2606:4700:4700::1111]:443", recipe.Host{Name: "2606:4700:4700::1111", Port: 443}},
		{"example.org:65535", recipe.Host{Name: "example.org", Port: 65535}},
	}
	for _, tc := range good {
		got, err := recipe.ParseHost(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q: (-want +got)\n%s", tc.in, diff)
		}
		if got.String() != tc.in {
			t.Errorf("%q: String() = %q", tc.in, got.String())
		}
	}
	const public = "allow only public destinations"
	for _, tc := range []bad{
		{"", "empty host", "DNS name"},
		{"*.example.com", `wildcard "*.example.com" is not allowed`, "wildcards are not allowed"},
		{"*", `wildcard "*" is not allowed`, "wildcards are not allowed"},
		{"localhost", "localhost is a loopback name", "loopback"},
		{"localhost:8080", "localhost is a loopback name", "loopback"},
		{"api.localhost", "api.localhost is a loopback name", "loopback"},
		{"127.0.0.1", "127.0.0.1 is a loopback address", public},
		{"127.0.0.53:53", "127.0.0.53 is a loopback address", public},
		{"[::1]:80", "::1 is a loopback address", public},
		{"::1", "::1 is a loopback address", public},
		{"169.254.169.254", "169.254.169.254 is a cloud metadata (link-local) address", public},
		{"169.254.1.1", "169.254.1.1 is a link-local address", public},
		{"fe80::1", "fe80::1 is a link-local address", public},
		{"fe80::1%eth0", `"fe80::1%eth0" has an IPv6 zone`, "DNS name"},
		{"10.0.0.1", "10.0.0.1 is a private address", public},
		{"172.16.0.1", "172.16.0.1 is a private address", public},
		{"192.168.1.1:22", "192.168.1.1 is a private address", public},
		{"fd00::1", "fd00::1 is a private address", public},
		{"[fd00:ec2::254]:80", "fd00:ec2::254 is a private address", public},
		{"0.0.0.0", "0.0.0.0 is an unspecified address", public},
		{"::", ":: is an unspecified address", public},
		{"100.64.0.1", "100.64.0.1 is a shared (CGNAT) address", public},
		{"224.0.0.1", "224.0.0.1 is a multicast address", public},
		{"ff02::1", "ff02::1 is a multicast address", public},
		{"255.255.255.255", "255.255.255.255 is a reserved address", public},
		{"0.1.2.3", `0.1.2.3 is a "this network" address`, public},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1 is a loopback address", public},
		{"[::ffff:169.254.169.254]:80", "::ffff:169.254.169.254 is a cloud metadata (link-local) address", public},
		{"::ffff:10.1.2.3", "::ffff:10.1.2.3 is a private address", public},
		{"::127.0.0.1", "::127.0.0.1 is an IPv4-compatible address", public},
		{"64:ff9b::a00:1", "64:ff9b::a00:1 is a private address (embedded in 64:ff9b::/96)", public},
		{"2002:7f00:1::", "2002:7f00:1:: is a loopback address (embedded in 2002::/16)", public},
		{"metadata.google.internal", "metadata.google.internal is a cloud metadata service", "credentials"},
		{"metadata.google.internal.", "metadata.google.internal. is a cloud metadata service", "credentials"},
		{"127.1", `"127.1" is neither a host name nor an IP address`, "four decimal numbers"},
		{"0x7f.0.0.1", `"0x7f.0.0.1" is neither a host name nor an IP address`, "four decimal numbers"},
		{"2130706433", `host name "2130706433" has a single label`, "fully qualified"},
		{"010.0.0.1", `"010.0.0.1" is neither a host name nor an IP address`, "four decimal numbers"},
		{"intranet", `host name "intranet" has a single label`, "fully qualified"},
		{"Example.org", `host name "Example.org" has uppercase letters`, `"example.org"`},
		{"example.org.", `host name "example.org." ends with a dot`, "trailing dot"},
		{"-a.example.org", `host name "-a.example.org" has a label starting or ending with '-'`, "DNS name"},
		{"a..example.org", `host name "a..example.org" has an empty label`, "DNS name"},
		{"a_b.example.org", `host name "a_b.example.org" has "_", which is not a letter, digit or '-'`, "DNS name"},
		{strings.Repeat("a", 64) + ".org", `host name "` + strings.Repeat("a", 64) + `.org" has a label longer than 63 characters`, "DNS name"},
		{strings.Repeat("a.", 127) + "org", "host name is longer than 253 characters", "DNS name"},
		{"example.org:0", `invalid port "0"`, "1 to 65535"},
		{"example.org:65536", `invalid port "65536"`, "1 to 65535"},
		{"example.org:080", `invalid port "080"`, "leading zeros"},
		{"example.org:", `invalid port ""`, "1 to 65535"},
		{"example.org:+80", `invalid port "+80"`, "1 to 65535"},
		{"[1.1.1.1]:80", `"[1.1.1.1]:80" puts an IPv4 address in brackets`, "without brackets"},
		{"[example.org]:80", `"example.org" is not an IPv6 address`, "DNS name"},
		{"[2606:4700::1111", `"[2606:4700::1111" has no closing ']'`, "DNS name"},
		{"https://example.org", `"https://example.org" is a URL, not a host`, "DNS name"},
		{"example.org/path", `"example.org/path" is a URL, not a host`, "DNS name"},
		{"user@example.org", `"user@example.org" is a URL, not a host`, "DNS name"},
		{"ex\u0430mple.org", "non-ASCII character U+0430 at byte 2", "homoglyph"},
		{"b\u00fccher.example", "non-ASCII character U+00FC at byte 1", "ASCII"},
	} {
		_, err := recipe.ParseHost(tc.in)
		checkErr(t, tc.in, err, tc.msg, tc.hint)
	}
}

func TestCheckGrantPath(t *testing.T) {
	forbidden := []string{"/srv/shed-root"}
	for _, p := range []string{"/srv/project", "/home/u/src", "/var/lib/toolshedx", "/var/lib/other", "/tmp", "/procfs", "/srv/shed-rootx"} {
		if err := recipe.CheckGrantPath(p, forbidden); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	const state = "neither shed's store nor its state"
	for _, tc := range []bad{
		{"", "empty path", "absolute"},
		{"/", "the root directory cannot be granted", "specific directory"},
		{"/var/lib/toolshed", "/var/lib/toolshed is shed's store or state", state},
		{"/var/lib/toolshed/store/x", "/var/lib/toolshed/store/x is inside /var/lib/toolshed, shed's store or state", state},
		{"/var/lib", "/var/lib contains /var/lib/toolshed, shed's store or state", state},
		{"/var", "/var contains /var/lib/toolshed, shed's store or state", state},
		{"/run", "/run contains /run/toolshed, shed's store or state", state},
		{"/run/toolshed/sock", "/run/toolshed/sock is inside /run/toolshed, shed's store or state", state},
		{"/srv/shed-root", "/srv/shed-root is shed's store or state", state},
		{"/srv/shed-root/store", "/srv/shed-root/store is inside /srv/shed-root, shed's store or state", state},
		{"/srv", "/srv contains /srv/shed-root, shed's store or state", state},
		{"relative/path", `path "relative/path" is not absolute`, "absolute host path"},
		{"./x", `path "./x" is not absolute`, "absolute host path"},
		{"~/x", `path "~/x" is not absolute`, "absolute host path"},
		{"/a/../b", `path "/a/../b" has a ".." element`, `without ".."`},
		{"/..", `path "/.." has a ".." element`, `without ".."`},
		{"/a/", `path "/a/" is not clean`, `write "/a"`},
		{"/a//b", `path "/a//b" is not clean`, `write "/a/b"`},
		{"/a/./b", `path "/a/./b" is not clean`, `write "/a/b"`},
		{"/proc", "/proc is in /proc", "never granted"},
		{"/proc/1", "/proc/1 is in /proc", "never granted"},
		{"/sys/fs/cgroup", "/sys/fs/cgroup is in /sys", "never granted"},
		{"/dev/sda", "/dev/sda is in /dev", "never granted"},
		{"/srv/proj\u0435ct", "non-ASCII character U+0435 at byte 9", "homoglyph"},
		{"/srv/a\nb", "control character U+000A at byte 6", "printable ASCII"},
	} {
		err := recipe.CheckGrantPath(tc.in, forbidden)
		checkErr(t, tc.in, err, tc.msg, tc.hint)
	}
	// The defaults hold whatever the caller passes.
	if err := recipe.CheckGrantPath("/var/lib/toolshed", nil); err == nil {
		t.Errorf("/var/lib/toolshed with no forbidden paths: got no error")
	}
}

func TestHostString(t *testing.T) {
	for _, tc := range []struct {
		h    recipe.Host
		want string
	}{
		{recipe.Host{Name: "example.org"}, "example.org"},
		{recipe.Host{Name: "example.org", Port: 80}, "example.org:80"},
		{recipe.Host{Name: "2001:db8::1", Port: 80}, "[2001:db8::1]:80"},
		{recipe.Host{Name: "2001:db8::1"}, "2001:db8::1"},
	} {
		if got := tc.h.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.h, got, tc.want)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	for _, tc := range []struct {
		e    recipe.Error
		want string
	}{
		{recipe.Error{File: "w.toml", Line: 3, Field: "apt.packages[1]", Msg: "bad"}, "w.toml:3: apt.packages[1]: bad"},
		{recipe.Error{File: "w.toml", Field: "name", Msg: "bad"}, "w.toml: name: bad"},
		{recipe.Error{File: "w.toml", Line: 2, Msg: "bad"}, "w.toml:2: bad"},
		{recipe.Error{Msg: "bad"}, "bad"},
		{recipe.Error{Field: "f", Msg: "bad"}, "f: bad"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
		if !errors.Is(&tc.e, recipe.ErrInvalid) {
			t.Errorf("%q: not ErrInvalid", tc.want)
		}
	}
}

// tomlString quotes s as a TOML basic string, escaping what TOML requires.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func TestSeed(t *testing.T) {
	good := []struct {
		in   string
		want recipe.Seed
	}{
		{"debian/bookworm", recipe.Seed{Raw: "debian/bookworm", Kind: "debian", Suite: "bookworm"}},
		{"debian/bookworm@20250110T000000Z", recipe.Seed{Raw: "debian/bookworm@20250110T000000Z", Kind: "debian", Suite: "bookworm", Snapshot: "20250110T000000Z"}},
		{"debian/bookworm-backports", recipe.Seed{Raw: "debian/bookworm-backports", Kind: "debian", Suite: "bookworm-backports"}},
		{"oci:img", recipe.Seed{Raw: "oci:img", Kind: "oci", Dir: "img", AbsDir: "/r/img", Tag: "latest"}},
		{"oci:./img:v1.2", recipe.Seed{Raw: "oci:./img:v1.2", Kind: "oci", Dir: "./img", AbsDir: "/r/img", Tag: "v1.2"}},
		{"oci:../images/deb:bookworm", recipe.Seed{Raw: "oci:../images/deb:bookworm", Kind: "oci", Dir: "../images/deb", AbsDir: "/images/deb", Tag: "bookworm"}},
		{"oci:/abs/img", recipe.Seed{Raw: "oci:/abs/img", Kind: "oci", Dir: "/abs/img", AbsDir: "/abs/img", Tag: "latest"}},
		{"oci:/a:b/c", recipe.Seed{Raw: "oci:/a:b/c", Kind: "oci", Dir: "/a:b/c", AbsDir: "/a:b/c", Tag: "latest"}},
		{"oci:dir:with:tag", recipe.Seed{Raw: "oci:dir:with:tag", Kind: "oci", Dir: "dir:with", AbsDir: "/r/dir:with", Tag: "tag"}},
		{"oci://docker.io/library/debian:bookworm", recipe.Seed{Raw: "oci://docker.io/library/debian:bookworm", Kind: "oci", Ref: "docker.io/library/debian", Tag: "bookworm"}},
		{"oci://127.0.0.1:5000/swe/base", recipe.Seed{Raw: "oci://127.0.0.1:5000/swe/base", Kind: "oci", Ref: "127.0.0.1:5000/swe/base", Tag: "latest"}},
		{"oci://localhost:5000/a/b@sha256:" + strings.Repeat("ab", 32), recipe.Seed{Raw: "oci://localhost:5000/a/b@sha256:" + strings.Repeat("ab", 32), Kind: "oci", Ref: "localhost:5000/a/b", Digest: "sha256:" + strings.Repeat("ab", 32)}},
		{"oci://ghcr.io/o/r:v1@sha256:" + strings.Repeat("ab", 32), recipe.Seed{Raw: "oci://ghcr.io/o/r:v1@sha256:" + strings.Repeat("ab", 32), Kind: "oci", Ref: "ghcr.io/o/r", Digest: "sha256:" + strings.Repeat("ab", 32)}},
	}
	for _, tc := range good {
		r, err := recipe.Parse("/r/workshop.toml", []byte("name = \"x\"\nseed = "+tomlString(tc.in)+"\n"), recipe.Options{})
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, r.Seed); diff != "" {
			t.Errorf("%q: (-want +got)\n%s", tc.in, diff)
		}
	}
	for _, tc := range []bad{
		{"", `unknown seed ""`, "debian/SUITE"},
		{"ubuntu/jammy", `unknown seed "ubuntu/jammy"`, "debian/SUITE"},
		{"Debian/bookworm", `unknown seed "Debian/bookworm"`, "debian/SUITE"},
		{"debian/", `invalid Debian suite ""`, "debian/bookworm"},
		{"debian/Bookworm", `invalid Debian suite "Bookworm"`, "debian/bookworm"},
		{"debian/b", `invalid Debian suite "b"`, "2 to 32"},
		{"debian/../x", `invalid Debian suite "../x"`, "debian/bookworm"},
		{"debian/bookworm@", `invalid snapshot ""`, "YYYYMMDDTHHMMSSZ"},
		{"debian/bookworm@2025-01-10", `invalid snapshot "2025-01-10"`, "YYYYMMDDTHHMMSSZ"},
		{"debian/bookworm@20251310T000000Z", `invalid snapshot "20251310T000000Z"`, "YYYYMMDDTHHMMSSZ"},
		{"debian/bookworm@20250110T000000", `invalid snapshot "20250110T000000"`, "YYYYMMDDTHHMMSSZ"},
		{"oci:", "OCI seed has no directory", "oci:DIR"},
		{"oci::v1", "OCI seed has no directory", "oci:DIR"},
		{"oci:img:", "empty OCI tag after ':'", "oci:DIR:TAG"},
		{"oci://user:secret@ghcr.io/o/r:v1", "an image reference holds no credentials", "podman login"},
		{"oci://token@ghcr.io/o/r", "an image reference holds no credentials", "docker login"},
		{"oci://debian:bookworm", `image "debian:bookworm" names no registry`, "oci://REGISTRY/REPO:TAG"},
		{"oci://ghcr.io/O/r:v1", `invalid image reference "ghcr.io/O/r:v1": invalid reference: invalid repository "O/r"`, "oci://REGISTRY/REPO:TAG"},
		{"oci://ghcr.io/o/r:-x", `invalid image reference "ghcr.io/o/r:-x": invalid reference: invalid tag "-x"`, "oci://REGISTRY/REPO:TAG"},
		{"oci://ghcr.io/o/r@sha256:abc", `invalid image reference "ghcr.io/o/r@sha256:abc": invalid reference: invalid digest "sha256:abc": invalid checksum digest length`, "sha256:DIGEST"},
		{"oci://ghcr.io/../r:v1", `invalid image reference "ghcr.io/../r:v1": invalid reference: invalid repository "../r"`, "oci://REGISTRY/REPO:TAG"},
		{"debian/bookw\u043erm", "non-ASCII character U+043E at byte 12", "homoglyph"},
	} {
		_, err := recipe.Parse("workshop.toml", []byte("name = \"x\"\nseed = "+tomlString(tc.in)+"\n"), recipe.Options{})
		checkErr(t, tc.in, err, tc.msg, tc.hint)
		var e *recipe.Error
		if errors.As(err, &e) && (e.Field != "seed" || e.Line != 2) {
			t.Errorf("%q: got field %q line %d, want seed line 2", tc.in, e.Field, e.Line)
		}
	}
}

func TestURLs(t *testing.T) {
	for _, u := range []string{
		"http://deb.debian.org/debian", "https://pypi.org/simple", "http://10.0.0.5:3142/debian",
		"http://127.0.0.1:8080/simple", "http://[::1]:3142/debian", "http://mirror/debian", "https://example.org",
	} {
		in := "name = \"x\"\nseed = \"debian/bookworm\"\n[apt]\nmirror = " + tomlString(u) + "\n[pip]\nindex = " + tomlString(u) + "\n"
		r, err := recipe.Parse("workshop.toml", []byte(in), recipe.Options{})
		if err != nil {
			t.Errorf("%q: %v", u, err)
			continue
		}
		if r.Apt.Mirror != u || r.Pip.Index != u {
			t.Errorf("%q: got mirror %q index %q", u, r.Apt.Mirror, r.Pip.Index)
		}
	}
	const creds = "credentials come from the environment or the credentials file at run time"
	for _, tc := range []bad{
		{"https://user:pass@vendor.example.com/apt", "URL has credentials (user:password@)", creds},
		{"https://token@vendor.example.com/apt", "URL has credentials (user:password@)", creds},
		{"https://vendor.example.com/apt?token=x", "URL has a query", "remove the query"},
		{"https://vendor.example.com/apt?", "URL has a query", "remove the query"},
		{"https://vendor.example.com/apt#x", "URL has a fragment", "remove the fragment"},
		{"ftp://vendor.example.com/apt", `URL scheme "ftp" is not allowed`, "http://"},
		{"file:///srv/mirror", `URL scheme "file" is not allowed`, "http://"},
		{"vendor.example.com/apt", `URL scheme "" is not allowed`, "http://"},
		{"http:vendor.example.com", "URL has no host", "http://"},
		{"http:///apt", "URL has no host", "http://"},
		{"http://vendor.example.com:0/apt", `URL has an invalid port "0"`, "1 to 65535"},
		{"http://vendor.example.com:/apt", "URL has an empty port", "http://"},
		{"http://Vendor.example.com/apt", `URL host: host name "Vendor.example.com" has uppercase letters`, "lowercase"},
		{"http://vend\u043er.example.com/apt", "non-ASCII character U+043E at byte 11", "homoglyph"},
		{"http://vendor.example.com/a b", "URL has a space", "%20"},
	} {
		for _, where := range []string{"[apt]\nmirror", "[pip]\nindex", "[[apt.source]]\nsuite = \"stable\"\ncomponents = [\"main\"]\nkey = \"k.asc\"\nurl"} {
			in := "name = \"x\"\nseed = \"debian/bookworm\"\n" + where + " = " + tomlString(tc.in) + "\n"
			_, err := recipe.Parse("workshop.toml", []byte(in), recipe.Options{})
			checkErr(t, tc.in, err, tc.msg, tc.hint)
			if err != nil && strings.Contains(tc.in, "@") && strings.Contains(err.Error()+err.(*recipe.Error).Hint, "vendor") {
				t.Errorf("%q: error %q repeats the credentials", tc.in, err)
			}
		}
	}
}

// TestParseFull parses a recipe that sets every key and compares the whole result.
func TestParseFull(t *testing.T) {
	const in = `name = "jq-tools"
seed = "debian/bookworm@20250110T000000Z"

[apt]
mirror = "https://deb.debian.org/debian"
packages = ["jq", "curl=7.88.1-10+deb12u5"]

[[apt.source]]
url = "https://vendor.example.com/apt"
suite = "stable"
components = ["main", "contrib"]
key = "keys/vendor.asc"

[pip]
index = "http://10.0.0.2:3141/simple"
packages = ["requests==2.31.0", "attrs"]

[network]
profile = "debian"
allow = ["api.github.com", "example.org:8443", "[2606:4700:4700::1111]:443"]

[[grant]]
path = "/srv/project"
mode = "rw"

[[grant]]
path = "/srv/data"
`
	got, err := recipe.Parse("/home/u/jq/workshop.toml", []byte(in), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &recipe.Recipe{
		File: "/home/u/jq/workshop.toml",
		Dir:  "/home/u/jq",
		Name: "jq-tools",
		Seed: recipe.Seed{Raw: "debian/bookworm@20250110T000000Z", Kind: "debian", Suite: "bookworm", Snapshot: "20250110T000000Z"},
		Apt: recipe.Apt{
			Mirror:   "https://deb.debian.org/debian",
			Packages: []recipe.AptPackage{{Name: "jq"}, {Name: "curl", Version: "7.88.1-10+deb12u5"}},
			Sources: []recipe.AptSource{{URL: "https://vendor.example.com/apt", Suite: "stable",
				Components: []string{"main", "contrib"}, Key: "keys/vendor.asc"}},
		},
		Pip: recipe.Pip{
			Index:    "http://10.0.0.2:3141/simple",
			Packages: []recipe.PipPackage{{Name: "requests", Version: "2.31.0"}, {Name: "attrs"}},
		},
		Network: recipe.Network{Profile: "debian", Allow: []recipe.Host{
			{Name: "api.github.com"}, {Name: "example.org", Port: 8443}, {Name: "2606:4700:4700::1111", Port: 443}}},
		Grants: []recipe.Grant{{Path: "/srv/project", Mode: "rw"}, {Path: "/srv/data", Mode: "ro"}},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(recipe.Recipe{})); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestParseDefaults(t *testing.T) {
	got, err := recipe.Parse("", []byte("name = \"x\"\nseed = \"debian/bookworm\"\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &recipe.Recipe{
		Name:    "x",
		Seed:    recipe.Seed{Raw: "debian/bookworm", Kind: "debian", Suite: "bookworm"},
		Apt:     recipe.Apt{Mirror: recipe.DefaultMirror},
		Pip:     recipe.Pip{Index: recipe.DefaultIndex},
		Network: recipe.Network{Profile: "none"},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(recipe.Recipe{})); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestForbiddenPaths(t *testing.T) {
	in := []byte("name = \"x\"\nseed = \"debian/bookworm\"\n[[grant]]\npath = \"/tmp\"\n")
	if _, err := recipe.Parse("workshop.toml", in, recipe.Options{}); err != nil {
		t.Fatalf("without --root: %v", err)
	}
	_, err := recipe.Parse("workshop.toml", in, recipe.Options{ForbiddenPaths: []string{"/tmp/shed-root"}})
	checkErr(t, "/tmp", err, "/tmp contains /tmp/shed-root, shed's store or state", "neither shed's store nor its state")
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "workshop.toml")
	if err := os.WriteFile(file, []byte("name = \"x\"\nseed = \"oci:img:v1\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := recipe.Load(file, recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.File != file || r.Dir != dir || r.Seed.AbsDir != filepath.Join(dir, "img") {
		t.Errorf("got File %q Dir %q AbsDir %q, want %q %q %q", r.File, r.Dir, r.Seed.AbsDir, file, dir, filepath.Join(dir, "img"))
	}

	_, err = recipe.Load(filepath.Join(dir, "missing.toml"), recipe.Options{})
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, recipe.ErrInvalid) {
		t.Errorf("missing file: got %v, want a not-exist error that is not ErrInvalid", err)
	}

	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, []byte("name = \"x\"\n#"+strings.Repeat("x", 1<<20)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = recipe.Load(big, recipe.Options{})
	checkErr(t, "big", err, "file is larger than 1048576 bytes", "small")
}

// TestSuggest: "did you mean" takes typos (a letter changed, missing, added or two swapped) and
// nothing else.
func TestSuggest(t *testing.T) {
	suites := []string{"bookworm", "bullseye", "trixie", "forky", "sid", "stable", "testing", "unstable"}
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"bookwrom", []string{"bookworm"}}, // two letters swapped
		{"bokworm", []string{"bookworm"}},  // one missing
		{"trixxie", []string{"trixie"}},    // one added
		{"stabel", []string{"stable"}},     // swapped, before "unstable" (two edits)
		{"unstabel", []string{"unstable"}},
		{"bookworm", nil}, // itself
		{"sod", nil},      // three letters: too short to guess
		{"jammy", nil},    // not a typo of any
		{"xyzzy", nil},
	} {
		if got := recipe.Suggest(c.in, suites, 2); !slices.Equal(got, c.want) {
			t.Errorf("Suggest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := recipe.Suggest("jqq", []string{"jq", "jo", "jp"}, 3); got != nil {
		t.Errorf("Suggest(jqq) among two-letter names = %q, want none", got)
	}
	if got := recipe.Suggest("python3-requsts", []string{"python3-requests", "python3-request", "python3-pip"}, 3); !slices.Equal(got, []string{"python3-requests", "python3-request"}) {
		t.Errorf("Suggest(python3-requsts) = %q", got)
	}
}

// TestErrorAt: an error found after parsing (a package the mirror does not have) names the line of
// the field.
func TestErrorAt(t *testing.T) {
	r, err := recipe.Parse("w.toml", []byte("name = \"x\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\n  \"jq\",\n  \"curl=9.9\",\n]\n[pip]\nindex = \"http://127.0.0.1:1/simple/\"\npackages = [\"a\", \"b==1\"]\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field, want string
	}{
		{"seed", "w.toml:2: seed: m"},
		{"apt.packages[1]", "w.toml:6: apt.packages[1]: m"},
		{"pip.packages[1]", "w.toml:10: pip.packages[1]: m"},
		{"pip.index", "w.toml:9: pip.index: m"},
	} {
		e := r.ErrorAt(c.field, "m", "h")
		if e.Error() != c.want || e.Hint != "h" || !errors.Is(e, recipe.ErrInvalid) {
			t.Errorf("ErrorAt(%q) = %q, want %q", c.field, e.Error(), c.want)
		}
	}
}

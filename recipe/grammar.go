package recipe

import (
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"oras.land/oras-go/v2/registry"
)

// The closed grammars. Each is anchored and ASCII-only: what is not listed is
// refused, so that nothing a reviewer does not see (an option, a pattern, a
// look-alike letter) reaches apt, pip, the network or a mount.
var (
	nameRe       = lazyRegexp(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	suiteRe      = lazyRegexp(`^[a-z][a-z0-9-]{1,31}$`)
	snapshotRe   = lazyRegexp(`^[0-9]{8}T[0-9]{6}Z$`)
	ociTagRe     = lazyRegexp(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	aptNameRe    = lazyRegexp(`^[a-z0-9][a-z0-9+.-]+$`)
	aptVersionRe = lazyRegexp(`^[A-Za-z0-9.+~:-]+$`)
	pipNameRe    = lazyRegexp(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	// pipVersionRe is our closed subset of PEP 440 public versions (and local
	// labels): it starts with a digit (an epoch "1!" or the release), ends with
	// a letter or digit, and uses only the characters PEP 440 spellings use.
	// A leading "v", which PEP 440 tolerates and pip normalizes away, is refused
	// so that a pin reads the way the index lists it; wildcards (==1.*) are
	// refused because a pin names one version.
	pipVersionRe = lazyRegexp(`^[0-9]([A-Za-z0-9.+!_-]*[A-Za-z0-9])?$`)
	sourceSuite  = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	componentRe  = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// lazyRegexp compiles on first use: compiling every grammar at package init would cost each shed
// process (and each sandbox init, the same binary) about half a millisecond, mostly for commands that
// never parse a recipe.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// invisible names the zero-width and bidirectional characters most used to make
// text read as something it is not.
var invisible = map[rune]string{
	0x00A0: "no-break space", 0x00AD: "soft hyphen", 0x034F: "combining grapheme joiner",
	0x200B: "zero width space", 0x200C: "zero width non-joiner", 0x200D: "zero width joiner",
	0x200E: "left-to-right mark", 0x200F: "right-to-left mark",
	0x202A: "left-to-right embedding", 0x202B: "right-to-left embedding", 0x202C: "pop directional formatting",
	0x202D: "left-to-right override", 0x202E: "right-to-left override",
	0x2060: "word joiner", 0x2066: "left-to-right isolate", 0x2067: "right-to-left isolate",
	0x2068: "first strong isolate", 0x2069: "pop directional isolate", 0xFEFF: "zero width no-break space",
}

// checkText refuses control characters and anything not ASCII, naming the code
// point and its byte offset: "does not match" would hide a homoglyph or an
// invisible character that the reader cannot see.
func checkText(s string) *Error {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b < 0x20 || b == 0x7f {
			return &Error{Msg: fmt.Sprintf("control character %U at byte %d", rune(b), i),
				Hint: "remove it: recipe strings are printable ASCII"}
		}
		if b < utf8.RuneSelf {
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return &Error{Msg: fmt.Sprintf("invalid UTF-8 byte 0x%02x at byte %d", b, i),
				Hint: "recipe strings are printable ASCII"}
		}
		e := &Error{Msg: fmt.Sprintf("non-ASCII character %U at byte %d", r, i)}
		switch name, ok := invisible[r]; {
		case ok:
			e.Hint = fmt.Sprintf("delete the invisible %s (%U): it makes text read differently from what it is; recipe strings are printable ASCII", name, r)
		case unicode.In(r, unicode.Cf, unicode.Zs, unicode.Mn, unicode.Me):
			e.Hint = fmt.Sprintf("delete the invisible or combining character %U; recipe strings are printable ASCII", r)
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			e.Hint = fmt.Sprintf("retype it in plain ASCII: %U may look like an ASCII character but is not (a homoglyph)", r)
		default:
			e.Hint = "retype it in plain ASCII: recipe strings are printable ASCII"
		}
		return e
	}
	return nil
}

func checkName(s string) *Error {
	if e := checkText(s); e != nil {
		return e
	}
	if !nameRe().MatchString(s) {
		return &Error{Msg: fmt.Sprintf("invalid name %q", s),
			Hint: "use 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, e.g. jq-tools"}
	}
	return nil
}

const seedHint = `write "debian/SUITE" or "debian/SUITE@SNAPSHOT" (e.g. "debian/bookworm@20250110T000000Z"), "oci://REGISTRY/REPO:TAG" or "oci://REGISTRY/REPO@sha256:DIGEST", or "oci:DIR" or "oci:DIR:TAG"`

const registrySeedHint = `write "oci://REGISTRY/REPO:TAG" or "oci://REGISTRY/REPO@sha256:DIGEST", e.g. "oci://docker.io/library/debian:bookworm"`

// parseRegistrySeed parses the part of an oci:// seed after the scheme with oras-go's parser of
// distribution references. A name is never resolved here: `shed lock` resolves a tag to a digest.
func parseRegistrySeed(seed Seed, rest string) (Seed, *Error) {
	host, _, _ := strings.Cut(rest, "/")
	if strings.Contains(host, "@") {
		// user:password@host would put a credential into the recipe, its lock, the derivation and
		// every log that names the seed.
		return Seed{}, &Error{Msg: "an image reference holds no credentials",
			Hint: "name the image without them; shed reads an image's registry credentials from the files `docker login` and `podman login` write"}
	}
	if !strings.Contains(rest, "/") {
		return Seed{}, &Error{Msg: fmt.Sprintf("image %q names no registry", rest), Hint: registrySeedHint}
	}
	ref, err := registry.ParseReference(rest)
	if err != nil {
		return Seed{}, &Error{Msg: fmt.Sprintf("invalid image reference %q: %v", rest, err), Hint: registrySeedHint}
	}
	seed.Kind, seed.Ref = "oci", ref.Registry+"/"+ref.Repository
	switch {
	case ref.Reference == "":
		seed.Tag = "latest"
	case strings.Contains(rest, "@"):
		d, err := ref.Digest()
		if err != nil || d.Algorithm() != "sha256" {
			return Seed{}, &Error{Msg: fmt.Sprintf("image %q: a digest must be sha256", rest), Hint: registrySeedHint}
		}
		seed.Digest = d.String() // a tag beside it ("REPO:TAG@sha256:...") is only a comment: the digest wins
	default:
		seed.Tag = ref.Reference
	}
	return seed, nil
}

func parseSeed(s string) (Seed, *Error) {
	if e := checkText(s); e != nil {
		return Seed{}, e
	}
	seed := Seed{Raw: s}
	switch {
	case strings.HasPrefix(s, "debian/"):
		suite, snap, pinned := strings.Cut(strings.TrimPrefix(s, "debian/"), "@")
		if !suiteRe().MatchString(suite) {
			return Seed{}, &Error{Msg: fmt.Sprintf("invalid Debian suite %q", suite),
				Hint: "a suite is 2 to 32 lowercase letters, digits or '-', starting with a letter, e.g. debian/bookworm"}
		}
		if pinned {
			if _, err := time.Parse("20060102T150405Z", snap); err != nil || !snapshotRe().MatchString(snap) {
				return Seed{}, &Error{Msg: fmt.Sprintf("invalid snapshot %q", snap),
					Hint: "a snapshot is a snapshot.debian.org timestamp YYYYMMDDTHHMMSSZ, e.g. debian/bookworm@20250110T000000Z"}
			}
		}
		seed.Kind, seed.Suite, seed.Snapshot = "debian", suite, snap
	case strings.HasPrefix(s, "oci://"):
		return parseRegistrySeed(seed, strings.TrimPrefix(s, "oci://"))
	case strings.HasPrefix(s, "oci:"):
		dir, tag := strings.TrimPrefix(s, "oci:"), "latest"
		// Split at the last ':' only when a valid tag follows: a directory may
		// itself hold a ':'.
		if i := strings.LastIndexByte(dir, ':'); i >= 0 {
			switch t := dir[i+1:]; {
			case ociTagRe().MatchString(t):
				dir, tag = dir[:i], t
			case t == "":
				return Seed{}, &Error{Msg: "empty OCI tag after ':'",
					Hint: `write "oci:DIR" for the tag "latest", or "oci:DIR:TAG"`}
			}
		}
		if dir == "" {
			return Seed{}, &Error{Msg: "OCI seed has no directory",
				Hint: `write "oci:DIR" or "oci:DIR:TAG", DIR being an OCI image layout directory, absolute or relative to the recipe's directory`}
		}
		seed.Kind, seed.Dir, seed.Tag = "oci", dir, tag
	default:
		hint := seedHint
		if kind, rest, ok := strings.Cut(s, "/"); ok {
			if g := Suggest(kind, []string{"debian"}, 1); len(g) > 0 {
				hint = fmt.Sprintf("did you mean %q? %s", g[0]+"/"+rest, seedHint)
			}
		}
		return Seed{}, &Error{Msg: fmt.Sprintf("unknown seed %q", s), Hint: hint}
	}
	return seed, nil
}

// ParseAptPackage parses a Debian package name with an optional "=VERSION".
// Anything apt-get would read as an option, a pattern, a file or a release
// selector is refused: the string is passed to apt as a package, nothing else.
func ParseAptPackage(s string) (AptPackage, error) {
	const hint = "list a Debian package by name, optionally pinned as name=VERSION, e.g. curl=7.88.1-10+deb12u5"
	fail := func(hint, format string, args ...any) (AptPackage, error) {
		return AptPackage{}, &Error{Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	if e := checkText(s); e != nil {
		return AptPackage{}, e
	}
	switch {
	case s == "":
		return fail(hint, "empty package name")
	case s[0] == '-':
		return fail("apt options are not allowed in a recipe: "+hint, "%q is an option, not a package", s)
	case strings.Contains(s, " "):
		return fail("write one package per string: "+hint, "%q has a space", s)
	case s[0] == '~' || s[0] == '?':
		return fail("apt search patterns are not allowed: "+hint, "%q is an apt pattern, not a package name", s)
	case strings.ContainsAny(s, "/*"):
		return fail("local .deb files, globs and name/release selectors are not allowed: "+hint,
			"%q is a path, glob or release selector, not a package name", s)
	}
	name, version, pinned := strings.Cut(s, "=")
	if !aptNameRe().MatchString(name) {
		switch {
		case strings.ContainsRune(name, ':'):
			return fail("architecture qualifiers are not supported: "+hint, "%q has an architecture qualifier", s)
		case strings.ToLower(name) != name:
			return fail(fmt.Sprintf("Debian package names are lowercase: write %q", strings.ToLower(s)),
				"invalid package name %q", name)
		}
		return fail("a Debian package name is at least 2 characters: lowercase letters, digits, '+', '-' and '.', starting with a letter or digit",
			"invalid package name %q", name)
	}
	if pinned {
		switch {
		case version == "":
			return fail(hint, "empty version after '='")
		case version[0] == '=':
			return fail("pin with a single '=': name=VERSION", "%q pins with '=='", s)
		case version[0] == '-':
			return fail(hint, "version %q starts with '-'", version)
		case !aptVersionRe().MatchString(version):
			return fail("a Debian version holds letters, digits and . + ~ : -", "invalid version %q", version)
		}
	}
	return AptPackage{Name: name, Version: version}, nil
}

// ParsePipPackage parses a PEP 508 name with an optional "==VERSION", and
// nothing else: options, URLs, markers, extras and ranges are refused, each
// with its own hint, since each would let a requirement fetch something the
// recipe does not name.
func ParsePipPackage(s string) (PipPackage, error) {
	const hint = "list a package as name or name==VERSION, e.g. requests==2.31.0"
	fail := func(hint, format string, args ...any) (PipPackage, error) {
		return PipPackage{}, &Error{Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	if e := checkText(s); e != nil {
		return PipPackage{}, e
	}
	switch {
	case s == "":
		return fail(hint, "empty package name")
	case s[0] == '-':
		return fail("options (--index-url, -i, -e, -r, ...) are not allowed in a requirement: set [pip] index for the index, and "+hint,
			"%q is a pip option, not a requirement", s)
	case strings.Contains(s, "://") || strings.Contains(s, "@"):
		return fail("URLs belong to the index setting ([pip] index), not to a requirement: pin the package as name==VERSION",
			"%q is a URL or direct reference, not a requirement", s)
	case strings.Contains(s, ";"):
		return fail("environment markers are not allowed: "+hint, "%q has an environment marker", s)
	case strings.Contains(s, "["):
		return fail("extras are not allowed: list the packages the extra would bring by name", "%q requests extras", s)
	case strings.Contains(s, " "):
		return fail("write one requirement per string, with no spaces: "+hint, "%q has a space", s)
	case strings.ContainsAny(s, "/\\"):
		return fail("local files and directories are not allowed: "+hint, "%q is a path, not a requirement", s)
	}
	name, rest := s, ""
	if i := strings.IndexAny(s, "=<>!~,"); i >= 0 {
		name, rest = s[:i], s[i:]
	}
	if !pipNameRe().MatchString(name) {
		return fail("a package name is letters, digits, '.', '_' and '-', starting and ending with a letter or digit",
			"invalid package name %q", name)
	}
	if rest == "" {
		return PipPackage{Name: name}, nil
	}
	op := rest[:len(rest)-len(strings.TrimLeft(rest, "=<>!~,"))]
	if op != "==" {
		return fail("pin an exact version with name==VERSION, or write the name alone", "version operator %q is not allowed", op)
	}
	version := rest[2:]
	switch {
	case version == "":
		return fail(hint, "empty version after '=='")
	case strings.Contains(version, "*"):
		return fail("pin one exact version, e.g. requests==2.31.0", "wildcard version %q is not allowed", version)
	case !pipVersionRe().MatchString(version):
		return fail("a version starts with a digit and holds letters, digits and . + ! _ -, e.g. 2.31.0", "invalid version %q", version)
	}
	return PipPackage{Name: name, Version: version}, nil
}

// NormalizePipName returns the PEP 503 normal form of a distribution name:
// lowercase, with each run of '-', '_' and '.' replaced by one '-'. pip treats
// names equal in this form as the same distribution.
func NormalizePipName(name string) string {
	var b strings.Builder
	sep := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '-' || c == '_' || c == '.' {
			sep = true
			continue
		}
		if sep {
			b.WriteByte('-')
			sep = false
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	if sep {
		b.WriteByte('-')
	}
	return b.String()
}

const hostHint = "write a DNS name or a public IP address, with an optional :PORT, e.g. api.github.com or example.org:8443"

// ParseHost parses a network destination: a DNS name or a public IP literal,
// with an optional port (IPv6 with a port as [addr]:port). Anything that would
// reach the host, its local network or a cloud metadata service is refused.
func ParseHost(s string) (Host, error) {
	fail := func(hint, format string, args ...any) (Host, error) {
		return Host{}, &Error{Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	if e := checkText(s); e != nil {
		return Host{}, e
	}
	switch {
	case s == "":
		return fail(hostHint, "empty host")
	case strings.Contains(s, "*"):
		return fail("list each host name exactly: wildcards are not allowed", "wildcard %q is not allowed", s)
	case strings.ContainsAny(s, "/@?#") || strings.Contains(s, "://"):
		return fail(hostHint, "%q is a URL, not a host", s)
	}
	host, port, hasPort := s, "", false
	bracketed := strings.HasPrefix(s, "[")
	switch {
	case bracketed:
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return fail(hostHint, "%q has no closing ']'", s)
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return fail(hostHint, "unexpected %q after ']'", port)
			}
			port, hasPort = port[1:], true
		}
	case strings.Count(s, ":") == 1:
		host, port, hasPort = strings.Cut(s, ":")
	}
	h := Host{}
	if hasPort {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 || port[0] < '1' || port[0] > '9' {
			return fail("a port is a number from 1 to 65535, without leading zeros", "invalid port %q", port)
		}
		h.Port = p
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return fail(hostHint, "%q has an IPv6 zone", host)
		}
		if bracketed && !addr.Is6() {
			return fail("write an IPv4 address without brackets, as ADDR or ADDR:PORT", "%q puts an IPv4 address in brackets", s)
		}
		if desc := nonPublic(addr); desc != "" {
			return fail("allow only public destinations: a Bench must not reach the host, its local network or a cloud metadata service",
				"%s is %s", host, desc)
		}
		h.Name = addr.String()
		return h, nil
	}
	if bracketed {
		return fail(hostHint, "%q is not an IPv6 address", host)
	}
	if strings.Contains(host, ":") {
		return fail(hostHint, "invalid address %q", host)
	}
	switch {
	case host == "localhost" || strings.HasSuffix(host, ".localhost") || host == "localhost.":
		return fail("a Bench never reaches the host's loopback: allow public hosts only", "%s is a loopback name", host)
	case strings.TrimSuffix(host, ".") == "metadata.google.internal":
		return fail("allow only public destinations: a cloud metadata service hands out the host's credentials",
			"%s is a cloud metadata service", host)
	}
	if e := checkDNSName(host, false); e != nil {
		return Host{}, e
	}
	h.Name = host
	return h, nil
}

// checkDNSName checks an LDH host name: labels of 1 to 63 lowercase letters,
// digits or '-' (not at either end), at most 253 characters, the last label not
// all digits (so that 127.1 or 2130706433 is never taken for a name).
// single allows one label (an apt or pip mirror on the local network).
func checkDNSName(host string, single bool) *Error {
	fail := func(hint, format string, args ...any) *Error {
		return &Error{Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	switch {
	case host == "":
		return fail(hostHint, "empty host name")
	case len(host) > 253:
		return fail(hostHint, "host name is longer than 253 characters")
	case strings.HasSuffix(host, "."):
		return fail(fmt.Sprintf("write %q, without the trailing dot", strings.TrimSuffix(host, ".")), "host name %q ends with a dot", host)
	case strings.ToLower(host) != host:
		return fail(fmt.Sprintf("write host names in lowercase: %q", strings.ToLower(host)), "host name %q has uppercase letters", host)
	}
	labels := strings.Split(host, ".")
	if len(labels) < 2 && !single {
		return fail("use a fully qualified name such as api.example.com", "host name %q has a single label", host)
	}
	for _, l := range labels {
		switch {
		case l == "":
			return fail(hostHint, "host name %q has an empty label", host)
		case len(l) > 63:
			return fail(hostHint, "host name %q has a label longer than 63 characters", host)
		case l[0] == '-' || l[len(l)-1] == '-':
			return fail(hostHint, "host name %q has a label starting or ending with '-'", host)
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fail(hostHint, "host name %q has %q, which is not a letter, digit or '-'", host, string(c))
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fail("write an IPv4 address as four decimal numbers, e.g. 93.184.216.34", "%q is neither a host name nor an IP address", host)
	}
	return nil
}

// Special-purpose ranges that netip has no predicate for, with the words that
// describe them (article included).
var reserved = []struct {
	prefix netip.Prefix
	kind   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `a "this network"`},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (CGNAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible"},
	{netip.MustParsePrefix("100::/64"), "a discard-only"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local"},
}

// Prefixes that embed an IPv4 address, which must itself be public.
var embedsIPv4 = []struct {
	prefix netip.Prefix
	at     int // byte offset of the IPv4 address
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},   // NAT64
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12}, // local-use NAT64
	{netip.MustParsePrefix("2002::/16"), 2},       // 6to4
}

// nonPublic describes a non-public address ("a loopback address"), or returns
// "" for a public one.
func nonPublic(a netip.Addr) string {
	a = a.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1
	kind := ""
	switch {
	case a.IsUnspecified():
		kind = "an unspecified"
	case a.IsLoopback():
		kind = "a loopback"
	case a == netip.AddrFrom4([4]byte{169, 254, 169, 254}):
		kind = "a cloud metadata (link-local)"
	case a.IsLinkLocalUnicast():
		kind = "a link-local"
	case a.IsMulticast():
		kind = "a multicast"
	case a.IsPrivate():
		kind = "a private"
	}
	for _, r := range reserved {
		if kind == "" && r.prefix.Contains(a) {
			kind = r.kind
		}
	}
	if kind != "" {
		return kind + " address"
	}
	for _, e := range embedsIPv4 {
		if e.prefix.Contains(a) {
			b := a.As16()
			v4 := netip.AddrFrom4([4]byte(b[e.at : e.at+4]))
			if desc := nonPublic(v4); desc != "" {
				return desc + " (embedded in " + e.prefix.String() + ")"
			}
		}
	}
	return ""
}

// checkURL checks an apt mirror, apt source or pip index URL: http or https,
// a host, no credentials, no query, no fragment. The URL is not echoed back:
// it may hold a password.
func checkURL(s string) *Error {
	const hint = "write an http:// or https:// URL, e.g. https://vendor.example.com/apt"
	fail := func(hint, msg string) *Error { return &Error{Msg: msg, Hint: hint} }
	if e := checkText(s); e != nil {
		return e
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fail(hint, "invalid URL")
	case u.User != nil:
		return fail("remove them: credentials come from the environment or the credentials file at run time, and never belong in a recipe",
			"URL has credentials (user:password@)")
	case u.Scheme != "http" && u.Scheme != "https":
		return fail(hint, fmt.Sprintf("URL scheme %q is not allowed", u.Scheme))
	case u.Opaque != "" || u.Host == "":
		return fail(hint, "URL has no host")
	case u.RawQuery != "" || u.ForceQuery:
		return fail("remove the query (?...): a mirror or index is a plain URL", "URL has a query")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fail("remove the fragment (#...)", "URL has a fragment")
	case strings.Contains(s, " "):
		return fail("percent-encode spaces as %20", "URL has a space")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || p[0] == '0' {
			return fail("a port is a number from 1 to 65535, without leading zeros", fmt.Sprintf("URL has an invalid port %q", p))
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return fail(hint, "URL has an empty port")
	}
	// A mirror or index may be local (a caching proxy on the LAN), so any IP
	// address and single-label names are accepted here.
	host := u.Hostname()
	if _, err := netip.ParseAddr(host); err == nil {
		if strings.Contains(host, "%") {
			return fail(hint, "URL host has an IPv6 zone")
		}
		return nil
	}
	if strings.HasPrefix(u.Host, "[") {
		return fail(hint, "URL host is not an IPv6 address")
	}
	if e := checkDNSName(host, true); e != nil {
		return &Error{Msg: "URL host: " + e.Msg, Hint: e.Hint}
	}
	return nil
}

func checkSuite(s string) *Error {
	if !sourceSuite().MatchString(s) || strings.Contains(s, "..") {
		return &Error{Msg: fmt.Sprintf("invalid suite %q", s),
			Hint: `a suite is letters, digits, '.', '_', '/' and '-', starting with a letter or digit, without "..", e.g. stable`}
	}
	return nil
}

func checkComponent(s string) *Error {
	if !componentRe().MatchString(s) {
		return &Error{Msg: fmt.Sprintf("invalid component %q", s),
			Hint: "a component is letters, digits, '.', '_' and '-', starting with a letter or digit, e.g. main"}
	}
	return nil
}

// checkKeyPath checks an apt source's key path: relative to the recipe's
// directory and inside it, so that a recipe names a key it ships with.
func checkKeyPath(s string) *Error {
	const hint = "give the key's path relative to the recipe's directory, e.g. keys/vendor.asc"
	switch {
	case s == "" || s == ".":
		return &Error{Msg: "empty key path", Hint: hint}
	case filepath.IsAbs(s):
		return &Error{Msg: fmt.Sprintf("key path %q is absolute", s), Hint: "keep the key beside the recipe and " + hint}
	case hasDotDot(s):
		return &Error{Msg: fmt.Sprintf(`key path %q has a ".." element`, s), Hint: "keep the key beside the recipe and " + hint}
	case filepath.Clean(s) != s:
		return &Error{Msg: fmt.Sprintf("key path %q is not clean", s), Hint: fmt.Sprintf("write %q", filepath.Clean(s))}
	}
	return nil
}

func hasDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// CheckGrantPath checks a grant's host path: absolute, clean, not "/", not in
// /proc, /sys or /dev, and neither equal to, an ancestor of, nor inside one of
// the forbidden paths (which add to /var/lib/toolshed and /run/toolshed).
// Symbolic links are not resolved here: the path is checked as written, and the
// Bench resolves it without leaving its bound when it mounts it.
func CheckGrantPath(p string, forbidden []string) error {
	fail := func(hint, format string, args ...any) error {
		return &Error{Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	if e := checkText(p); e != nil {
		return e
	}
	const stateHint = "grant a directory that holds neither shed's store nor its state, such as a project directory: a Bench must not reach them"
	switch {
	case p == "":
		return fail("grant an absolute host path, e.g. /srv/project", "empty path")
	case p[0] != '/':
		return fail("grant an absolute host path, e.g. /srv/project", "path %q is not absolute", p)
	case hasDotDot(p):
		return fail(`write the path it means, without ".." elements`, `path %q has a ".." element`, p)
	case filepath.Clean(p) != p:
		return fail(fmt.Sprintf("write %q", filepath.Clean(p)), "path %q is not clean", p)
	case p == "/":
		return fail("grant a specific directory, such as a project directory", "the root directory cannot be granted")
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if p == sys || strings.HasPrefix(p, sys+"/") {
			return fail("grants are for your data: /proc, /sys and /dev are never granted (a Bench has its own)",
				"%s is in %s", p, sys)
		}
	}
	for _, f := range append(append([]string(nil), defaultForbidden...), forbidden...) {
		if f == "" {
			continue
		}
		if abs, err := filepath.Abs(f); err == nil {
			f = abs
		}
		switch {
		case p == f:
			return fail(stateHint, "%s is shed's store or state", p)
		case f == "/" || strings.HasPrefix(p, f+"/"):
			return fail(stateHint, "%s is inside %s, shed's store or state", p, f)
		case strings.HasPrefix(f, p+"/"):
			return fail(stateHint, "%s contains %s, shed's store or state", p, f)
		}
	}
	return nil
}

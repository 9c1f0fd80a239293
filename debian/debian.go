// Package debian reads Debian's own formats: a signed InRelease, Packages indexes, apt-get --print-uris
// output and dpkg's status file.
package debian

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Debian's own formats: a signed InRelease, Packages indexes and dpkg's
// status file are all deb822 paragraphs ("Key: value" lines, continuation
// lines start with a space, paragraphs separated by blank lines).

// Paragraphs calls fn with each paragraph's fields. Continuation lines are
// appended to the field's value with a newline, as deb822 specifies.
func Paragraphs(r io.Reader, fn func(map[string]string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	fields := map[string]string{}
	last := ""
	flush := func() error {
		if len(fields) == 0 {
			return nil
		}
		err := fn(fields)
		fields, last = map[string]string{}, ""
		return err
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			if err := flush(); err != nil {
				return err
			}
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue // not a field; Packages files have none of these
			}
			last = k
			fields[k] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return flush()
}

// ReleaseDate returns the Date: field of a Release or InRelease file. apt has
// already checked the signature when we read it from inside the sandbox; when
// shed reads it directly (to pick the seed's epoch) the date only names the
// mirror state that apt will verify.
func ReleaseDate(b []byte) (time.Time, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Date:"); ok {
			t, err := time.Parse(time.RFC1123, strings.TrimSpace(v))
			if err != nil {
				// Debian writes "UTC"; RFC1123Z covers "+0000".
				t, err = time.Parse(time.RFC1123Z, strings.TrimSpace(v))
			}
			if err != nil {
				return time.Time{}, fmt.Errorf("parse release date %q: %w", strings.TrimSpace(v), err)
			}
			return t.UTC(), nil
		}
		if line == "" && strings.Contains(string(b), "BEGIN PGP SIGNATURE") {
			// The fields end at the first blank line after the header.
			continue
		}
	}
	return time.Time{}, errors.New("release file has no Date field")
}

// PackageEntry is one paragraph of a Packages index.
type PackageEntry struct {
	Package, Version, Architecture string
	Filename                       string
	SHA256                         string
	Size                           int64
}

// IndexByFilename reads a Packages index and returns the entries whose
// Filename is in want. The SHA-256 comes from here, the signed index, because
// apt's --print-uris gives only MD5.
func IndexByFilename(r io.Reader, want map[string]bool) (map[string]PackageEntry, error) {
	found := map[string]PackageEntry{}
	err := Paragraphs(r, func(f map[string]string) error {
		fn := f["Filename"]
		if !want[fn] {
			return nil
		}
		size, err := strconv.ParseInt(f["Size"], 10, 64)
		if err != nil {
			return fmt.Errorf("package %s: bad size %q", f["Package"], f["Size"])
		}
		found[fn] = PackageEntry{
			Package: f["Package"], Version: f["Version"], Architecture: f["Architecture"],
			Filename: fn, SHA256: f["SHA256"], Size: size,
		}
		return nil
	})
	return found, err
}

// Available is what Packages indexes offer, by package name: for a recipe's error about a package
// or a version that is not there, saying what is.
type Available struct {
	Versions map[string][]string // each package's versions, in the order the indexes give them
	Provides map[string][]string // each virtual package's providers
}

// AddIndex adds a Packages index (or dpkg's status file) to a.
func (a *Available) AddIndex(r io.Reader) error {
	if a.Versions == nil {
		a.Versions, a.Provides = map[string][]string{}, map[string][]string{}
	}
	return Paragraphs(r, func(f map[string]string) error {
		name, v := f["Package"], f["Version"]
		if name == "" {
			return nil
		}
		if !slices.Contains(a.Versions[name], v) {
			a.Versions[name] = append(a.Versions[name], v)
		}
		for _, p := range strings.Split(f["Provides"], ",") {
			// "mail-transport-agent", "awk (= 1:5.2.1-2)"
			p, _, _ = strings.Cut(strings.TrimSpace(p), " ")
			if p != "" && !slices.Contains(a.Provides[p], name) {
				a.Provides[p] = append(a.Provides[p], name)
			}
		}
		return nil
	})
}

// URI is one line of `apt-get install --print-uris`.
type URI struct {
	URL      string // as apt will fetch it
	FileName string // the name apt stores it under
	Size     int64
}

// ParsePrintURIs parses apt-get's --print-uris output:
//
//	'http://deb.debian.org/debian/pool/main/j/jq/jq_1.6-2.1_amd64.deb' jq_1.6-2.1_amd64.deb 63984 MD5Sum:...
func ParsePrintURIs(out []byte) ([]URI, error) {
	var uris []URI
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "'") {
			continue // apt's other chatter
		}
		end := strings.Index(line[1:], "'")
		if end < 0 {
			return nil, fmt.Errorf("unterminated URL in %q", line)
		}
		raw := line[1 : end+1]
		f := strings.Fields(line[end+2:])
		if len(f) < 2 {
			return nil, fmt.Errorf("short --print-uris line %q", line)
		}
		size, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad size in %q", line)
		}
		// apt escapes characters such as '~', '+' and ':' (%7e, %2b, %3a):
		// normalize to the form Packages' Filename uses.
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("bad URL in %q: %w", line, err)
		}
		clean := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
		uris = append(uris, URI{URL: clean.String(), FileName: f[0], Size: size})
	}
	return uris, nil
}

// Installed is a package dpkg considers installed.
type Installed struct {
	Package, Version, Architecture string
}

// Unfinished lists the packages of a dpkg status file that an install or
// removal left half done, as "name (state)": the states and the reinstreq
// flag that `dpkg --audit` reports.
func Unfinished(b []byte) ([]string, error) {
	var out []string
	err := Paragraphs(bytes.NewReader(b), func(f map[string]string) error {
		st := strings.Fields(f["Status"]) // want flag state
		if len(st) != 3 {
			return nil
		}
		switch {
		case st[1] == "reinstreq":
			out = append(out, f["Package"]+" (needs reinstalling)")
		case st[2] == "half-installed" || st[2] == "unpacked" || st[2] == "half-configured" ||
			st[2] == "triggers-awaiting" || st[2] == "triggers-pending":
			out = append(out, f["Package"]+" ("+st[2]+")")
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// ParseStatus reads dpkg's status file and returns the installed packages by name.
func ParseStatus(b []byte) (map[string]Installed, error) {
	pkgs := map[string]Installed{}
	err := Paragraphs(bytes.NewReader(b), func(f map[string]string) error {
		if f["Status"] != "install ok installed" {
			return nil
		}
		pkgs[f["Package"]] = Installed{f["Package"], f["Version"], f["Architecture"]}
		return nil
	})
	return pkgs, err
}

package debian

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReleaseDate(t *testing.T) {
	in := "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nOrigin: Debian\nDate: Sat, 11 Jul 2026 10:16:37 UTC\nMD5Sum:\n abc 1 x\n"
	got, err := ReleaseDate([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 7, 11, 10, 16, 37, 0, time.UTC); !got.Equal(want) || got.Unix() != 1783764997 {
		t.Errorf("got %v (%d), want %v (1783764997)", got, got.Unix(), want)
	}
	if _, err := ReleaseDate([]byte("Origin: x\n")); err == nil {
		t.Error("a release without Date was accepted")
	}
}

func TestIndexByFilename(t *testing.T) {
	idx := `Package: jq
Version: 1.6-2.1+deb12u2
Architecture: amd64
Description: lightweight
 and flexible
Filename: pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb
Size: 63984
SHA256: f2303584378ac85f6d3a9ae8e46412196061681e81610d3b020abe4b5d389eb0

Package: other
Version: 1
Architecture: all
Filename: pool/main/o/other/other_1_all.deb
Size: 1
SHA256: 00
`
	got, err := IndexByFilename(strings.NewReader(idx), map[string]bool{"pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb": true})
	if err != nil {
		t.Fatal(err)
	}
	e, ok := got["pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb"]
	if !ok || len(got) != 1 {
		t.Fatalf("got %v", got)
	}
	if e.Package != "jq" || e.Version != "1.6-2.1+deb12u2" || e.Size != 63984 || !strings.HasPrefix(e.SHA256, "f2303584") {
		t.Errorf("got %+v", e)
	}
}

func TestParsePrintURIs(t *testing.T) {
	out := "Reading package lists...\n'http://deb.debian.org/debian/pool/main/o/openssl/libssl3_3.0.20-1%7edeb12u2_amd64.deb' libssl3_3.0.20-1~deb12u2_amd64.deb 2036016 MD5Sum:4efab63a42e193c6107a3e1d1c46eaa4\n"
	uris, err := ParsePrintURIs([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(uris) != 1 || uris[0].URL != "http://deb.debian.org/debian/pool/main/o/openssl/libssl3_3.0.20-1~deb12u2_amd64.deb" || uris[0].Size != 2036016 {
		t.Errorf("got %+v", uris)
	}
	if _, err := ParsePrintURIs([]byte("'http://x/y.deb' y.deb notasize MD5Sum:1\n")); err == nil {
		t.Error("a bad size was accepted")
	}
}

func TestParseStatus(t *testing.T) {
	st := "Package: jq\nStatus: install ok installed\nVersion: 1.6\nArchitecture: amd64\n\nPackage: gone\nStatus: deinstall ok config-files\nVersion: 2\n"
	got, err := ParseStatus([]byte(st))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["jq"].Version != "1.6" {
		t.Errorf("got %v", got)
	}
}

func TestUnfinished(t *testing.T) {
	status := `Package: ok
Status: install ok installed
Version: 1

Package: gone
Status: deinstall ok config-files
Version: 1

Package: half
Status: install ok half-configured
Version: 1

Package: unpacked
Status: install ok unpacked
Version: 1

Package: broken
Status: install reinstreq half-installed
Version: 1

Package: trig
Status: install ok triggers-pending
Version: 1
`
	got, err := Unfinished([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"broken (needs reinstalling)", "half (half-configured)", "trig (triggers-pending)", "unpacked (unpacked)"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestAvailable(t *testing.T) {
	var a Available
	idx := "Package: jq\nVersion: 1.6-2.1\nDepends: libjq1\n\nPackage: exim4-daemon-light\nVersion: 4.96-15\nProvides: mail-transport-agent, exim4-daemon (= 4.96-15)\n\n" +
		"Package: postfix\nVersion: 3.7.11-0+deb12u1\nProvides: mail-transport-agent\n"
	status := "Package: jq\nStatus: install ok installed\nVersion: 1.6-2.1+deb12u1\n\nPackage: jq\nVersion: 1.6-2.1\n"
	for _, in := range []string{idx, status} {
		if err := a.AddIndex(strings.NewReader(in)); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Versions["jq"]; !slices.Equal(got, []string{"1.6-2.1", "1.6-2.1+deb12u1"}) {
		t.Errorf("versions of jq: %q", got)
	}
	if got := a.Provides["mail-transport-agent"]; !slices.Equal(got, []string{"exim4-daemon-light", "postfix"}) {
		t.Errorf("providers of mail-transport-agent: %q", got)
	}
	if got := a.Provides["exim4-daemon"]; !slices.Equal(got, []string{"exim4-daemon-light"}) {
		t.Errorf("providers of exim4-daemon: %q", got)
	}
	if _, ok := a.Versions["mail-transport-agent"]; ok {
		t.Error("a virtual package has versions")
	}
}

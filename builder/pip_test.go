package builder_test

import (
	"strings"
	"testing"

	"toolshed.dev/shed/builder"
)

// A report as pip 23.0 writes it (archive_info.hash), and one as pip 23.1+
// writes it (archive_info.hashes).
const pipReport = `{"version": "1", "pip_version": "23.0.1", "install": [
 {"download_info": {"url": "http://127.0.0.1:8080/files/shedtest_beta-1.0-py3-none-any.whl",
   "archive_info": {"hash": "sha256=BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"}},
  "is_direct": false, "requested": true, "metadata": {"name": "shedtest-beta", "version": "1.0"}},
 {"download_info": {"url": "http://127.0.0.1:8080/files/Shedtest_Alpha-2.0-py3-none-any.whl",
   "archive_info": {"hashes": {"sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}},
  "is_direct": false, "requested": false, "metadata": {"name": "Shedtest_Alpha", "version": "2.0"}}
], "environment": {}}`

func TestParsePipReport(t *testing.T) {
	got, err := builder.ParsePipReport([]byte(pipReport))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d wheels", len(got))
	}
	a, b := got[0], got[1]
	if a.Name != "shedtest-alpha" || a.Version != "2.0" || a.Declared || a.SHA256 != strings.Repeat("a", 64) {
		t.Errorf("dependency: %+v", a)
	}
	if b.Name != "shedtest-beta" || !b.Declared || b.SHA256 != strings.Repeat("b", 64) {
		t.Errorf("requested package: %+v", b)
	}
	for _, c := range []struct{ edit, want string }{
		{`"hash": "sha256=BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"`, "no SHA-256"},
		{`shedtest_beta-1.0-py3-none-any.whl`, "not a wheel"},
		{`"is_direct": false, "requested": true`, "direct reference"},
		{`"version": "1", "pip`, "format version"},
	} {
		bad := pipReport
		switch c.want {
		case "no SHA-256":
			bad = strings.Replace(bad, c.edit, `"hash": "md5=00"`, 1)
		case "not a wheel":
			bad = strings.Replace(bad, c.edit, "shedtest-beta-1.0.tar.gz", 1)
		case "direct reference":
			bad = strings.Replace(bad, c.edit, `"is_direct": true, "requested": true`, 1)
		case "format version":
			bad = strings.Replace(bad, c.edit, `"version": "2", "pip`, 1)
		}
		if _, err := builder.ParsePipReport([]byte(bad)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.want, err)
		}
	}
}

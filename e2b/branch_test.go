package e2b

import (
	"encoding/json"
	"testing"
)

// TestSnapshotRef: E2B's ways of naming a snapshot (NAME, OWNER/NAME, with the default tag) are
// shed's references (OWNER/NAME kept: that owner's NAME only, app's ownSnapshot); another tag names
// nothing (kept whole, it matches no snapshot's name).
func TestSnapshotRef(t *testing.T) {
	for in, want := range map[string]string{
		"abc123":              "abc123",
		"snap":                "snap",
		"snap:default":        "snap",
		"nobody/snap":         "nobody/snap",
		"nobody/snap:default": "nobody/snap",
		"snap:v1":             "snap:v1",
		"":                    "",
	} {
		if got := snapshotRef(in); got != want {
			t.Errorf("snapshotRef(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAutoResumes: only an autoResume that asks for it is refused; E2B's off, absent and null are not,
// and a value not of E2B's shape is refused rather than ignored.
func TestAutoResumes(t *testing.T) {
	for in, want := range map[string]bool{
		``: false, `null`: false, `{"enabled":false}`: false, `{}`: false,
		`{"enabled":true}`: true, `7`: true, `"yes"`: true,
	} {
		if got := autoResumes(json.RawMessage(in)); got != want {
			t.Errorf("autoResumes(%s) = %v, want %v", in, got, want)
		}
	}
}

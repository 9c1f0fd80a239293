package main

import (
	"runtime/debug"
	"testing"
)

func TestVersionString(t *testing.T) {
	info := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "140887e3a1b2c3d4e5f60718293a4b5c6d7e8f90"},
		{Key: "vcs.time", Value: "2026-12-01T20:27:00Z"},
		{Key: "vcs.modified", Value: "false"},
	}}
	if got, want := versionString("0.12.0", "", info), "0.12.0 (commit 140887e3a1b2, 2026-12-01T20:27:00Z)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	info.Settings[2].Value = "true"
	if got, want := versionString("0.12.0", "", info), "0.12.0 (commit 140887e3a1b2 with uncommitted changes, 2026-12-01T20:27:00Z)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := versionString("0.12.0", "140887e3a1b2-dirty", info), "0.12.0 (commit 140887e3a1b2-dirty)"; got != want {
		t.Errorf("linked: got %q, want %q", got, want)
	}
	if got, want := versionString("dev", "", &debug.BuildInfo{}), "dev (commit unknown: not built from a git checkout)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

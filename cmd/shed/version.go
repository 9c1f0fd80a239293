package main

import (
	"fmt"
	"runtime/debug"
)

// commit is set by the linker (-X main.commit=..., the Makefile does it from git): the commit shed was
// built from, "-dirty" appended when the tree had uncommitted changes.
var commit string

// versionString is shed's version and the commit it was built from: the linker's, else what the Go
// toolchain stamped into the binary (a build in a git checkout without -buildvcs=false: the revision,
// its time, and whether the tree had uncommitted changes).
func versionString(v, linked string, info *debug.BuildInfo) string {
	if linked != "" {
		return fmt.Sprintf("%s (commit %s)", v, linked)
	}
	commit, at, dirty := "", "", false
	if info != nil {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if commit == "" {
		return v + " (commit unknown: not built from a git checkout)"
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if dirty {
		commit += " with uncommitted changes"
	}
	return fmt.Sprintf("%s (commit %s, %s)", v, commit, at)
}

func buildVersion() string {
	info, _ := debug.ReadBuildInfo()
	return versionString(version, commit, info)
}

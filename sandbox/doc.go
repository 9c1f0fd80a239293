// Package sandbox is the small, privileged part of Toolshed: it runs one command in a Linux sandbox
// described by a plain-data Spec (namespaces, an overlay root of store paths, binds, a network namespace
// reached only through listening sockets, cgroup limits). Builders use it to run apt over an overlay and
// capture the upper directory; Benches use it for agent tasks.
//
// Spec.Validate checks a spec without system calls. Start and Run apply it: they re-execute the current
// binary, from a sealed in-memory copy, as the sandbox's init, so every binary that uses this package
// must call Init first thing in main. Exec runs more commands in a running sandbox through its control
// socket (Spec.Control), served by that init; Sweep removes the cgroups of sandboxes whose process was
// killed. It imports no other package of this project.
//
// See docs/sandbox.md for the steps, the guarantees and the measured costs.
package sandbox

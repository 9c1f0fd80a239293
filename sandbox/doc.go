// Package sandbox is the small, privileged package that applies a plain-data
// Spec: namespaces, overlay mounts, pivot_root, /proc and /dev, no_new_privs.
// It imports neither store nor derivation (issue 3).
//
// It is empty: the folder exists so that the layout of docs/architecture.md
// holds from the start; the issue named above fills it.
package sandbox

// Package cache shares store paths through an OCI registry or an OCI layout
// directory, with signed provenance beside the bytes (issue 6).
//
// It is empty: the folder exists so that the layout of docs/architecture.md
// holds from the start; the issue named above fills it.
package cache

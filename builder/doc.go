// Package builder realizes missing store paths: fetches with verified hashes,
// Debian seeds with mmdebstrap, and apt and pip layers built inside the
// sandbox with no network (issue 3).
//
// It is empty: the folder exists so that the layout of docs/architecture.md
// holds from the start; the issue named above fills it.
package builder

// Package store owns the Tool Shed: a directory of immutable, content-addressed
// store paths, their metadata, the roots that keep them alive, and the locks
// that let several shed processes share one store.
//
// The store is a cache and never an authority: every path in it can be derived
// again from a recipe, and deleting the whole store loses only time. A path is
// valid when, and only when, both its bytes (under store/) and its metadata
// record (in db/meta.db) are present; everything else is debris that the next
// operation sweeps. See docs/architecture.md for the on-disk layout and the
// crash model.
//
// This package imports no other package of the project but internal/atomicfile, the one way shed
// replaces a file, and internal/userns, which says whether shed runs in its user namespace (and so
// under which name the store keeps overlayfs's opaque mark: OpaqueXattr).
package store

// Package cache shares store paths through an OCI registry or an OCI layout
// directory, with signed provenance beside the bytes (issue 6).
//
// Each store path travels as one uncompressed tar layer (WriteLayer), read
// back only into exactly the tree its trusted manifest describes (ReadLayer).
package cache

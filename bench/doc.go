// Package bench launches Benches: an overlay of a Workshop's store paths plus
// an empty upper layer, with grants and a network profile (issue 4).
//
// It is empty: the folder exists so that the layout of docs/architecture.md
// holds from the start; the issue named above fills it.
package bench

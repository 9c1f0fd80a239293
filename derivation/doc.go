// Package derivation defines the build step of the Tool Shed: a Derivation
// says what to build (kind, builder, arguments, environment, network profile)
// from which inputs, in a canonical text encoding whose BLAKE3 hash keys the
// output store path. The encoding is a store format: changing it changes every
// path, so it is versioned ("shed-derivation v1") and pinned by golden tests.
package derivation

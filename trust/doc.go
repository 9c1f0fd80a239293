// Package trust signs what the store builds and decides what it may use.
//
// A hash is identity, not trust: a store path's hash says which recipe it claims to realize, and its
// content hash which bytes it holds, but only a signature by a key the store trusts says that someone
// it trusts built those bytes from that recipe. Every path the builder registers carries a provenance
// (its derivation, its inputs with their content hashes, what was fetched, the builder's identity
// and the time) in a DSSE envelope signed with the store's ed25519 key. A path that arrives from
// anywhere else (a registry, an OCI layout directory) is registered only if a trusted key signed a
// provenance that names exactly that path, its content hash, size, references, deriver and content
// address, and the bytes re-hash to it; only then is its time recorded as the path's replay bound.
// docs/trust.md says what this protects and what it does not.
package trust

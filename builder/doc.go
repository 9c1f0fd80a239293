// Package builder realizes store paths: it fetches fixed-output files (each
// .deb once, verified against the lock's SHA-256), builds Debian seeds with
// mmdebstrap or imports them from OCI images, and builds apt layers inside the
// sandbox with no network and no grants, capturing and normalizing the overlay
// upper so that equal inputs give equal bytes. It also resolves recipes into
// locks (`shed lock`), with apt's own resolver running in a sandbox whose
// network reaches only the mirror.
//
// The builder makes sandbox plans (sandbox.Spec, plain data) and never does
// namespace or mount work itself.
package builder

// Package supervisor is the privileged daemon that owns the store, the
// Workshop records and the signing key, and takes proposals from Benches
// (issue 7).
//
// It is empty: the folder exists so that the layout of docs/architecture.md
// holds from the start; the issue named above fills it.
package supervisor

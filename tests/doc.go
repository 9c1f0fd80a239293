// Package tests holds end-to-end tests that run shed as a user would: from
// the repository's README commands, on a store of their own.
package tests

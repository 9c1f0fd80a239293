package app

import (
	"errors"
	"fmt"
	"testing"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/store"
)

// TestClassifyHint: the hint a package attached to its error (internal/hint) is the error's hint,
// for the CLI's `shed: hint:` line and the supervisor's API alike, ahead of the one its kind has.
func TestClassifyHint(t *testing.T) {
	err := fmt.Errorf("why: %w", hint.Wrap(fmt.Errorf("%w: x", store.ErrNotExist), "run `shed realize w.toml` first"))
	e := Classify(err)
	if e.Hint != "run `shed realize w.toml` first" || e.Code != CodeNotFound || e.Error() != "why: store path not valid: x" {
		t.Errorf("Classify: code %s, hint %q, error %q", e.Code, e.Hint, e.Error())
	}
	if e := Classify(errors.New("plain")); e.Hint != "" {
		t.Errorf("a plain error has hint %q", e.Hint)
	}
}

// Package hint attaches what to do about an error to the error, apart from its text, where the
// advice is known below the application layer (a builder, the records, a cache). The application
// layer puts it on the error's hint (app.Classify), which the CLI prints as `shed: hint: ...` and
// the supervisor's API sends as the error's hint: advice in an error's own text, in parentheses,
// reaches neither.
package hint

import "errors"

// Error is an error with what to do about it.
type Error struct {
	Err  error
	Hint string
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Wrap returns err with hint; nil stays nil.
func Wrap(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, Hint: hint}
}

// Of returns the hint of the outermost *Error in err's chain, or "".
func Of(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Hint
	}
	return ""
}

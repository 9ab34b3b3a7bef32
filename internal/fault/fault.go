// Package fault holds the two kinds of error that stop the connector
// instead of being retried, whichever side (PostgreSQL or Kafka) found them:
// a prerequisite an operator must change, and a fatal condition with its
// metrics label. The CLI maps them to exit codes; the stream and the
// producers classify their own errors into them once.
package fault

import "errors"

// PrerequisiteError is a server setting or privilege that must change before
// the connector can run. It is fatal: retrying cannot fix it.
type PrerequisiteError struct {
	Problem string
	Fix     string
}

func (e *PrerequisiteError) Error() string { return e.Problem + "; " + e.Fix }

// FatalError is an error that retrying cannot fix.
type FatalError struct {
	Err error
	// Reason is a short label for metrics: slot_missing, slot_invalidated, ...
	Reason string
}

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// IsFatal reports whether err must stop the connector rather than be retried.
func IsFatal(err error) bool {
	var f *FatalError
	var p *PrerequisiteError
	return errors.As(err, &f) || errors.As(err, &p)
}

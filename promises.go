package contend

import (
	"errors"
	"strings"
)

// Promises is what a [Guard] promises the code it runs, as values a caller
// or a test can check: the same Do call site means different things under
// different guards, and switching one for another is safe only when the new
// guard keeps every promise the call site relies on (see [Promises.Check]).
type Promises struct {
	// Exclusive: no two fns for one key run at the same time. False for the
	// optimistic guard, whose fns overlap and commit one per version.
	Exclusive bool
	// AtMostOnce: fn runs at most once per Do. False where the guard runs
	// fn again (an optimistic retry, a transaction retried after a
	// deadlock, a job redelivered): effects fn has outside the guard's
	// transaction must then be idempotent.
	AtMostOnce bool
	// Waits: Do does not give up on a held or contested key at once: it
	// waits for the key (or, optimistically, tries again) until ctx ends or
	// its policy runs out. Otherwise it answers a held key with
	// [ErrConflict] at once.
	Waits bool
	// AcrossProcesses: the promises hold between every process that shares
	// the backend, not only between the goroutines of one process.
	AcrossProcesses bool
	// InTransaction: fn runs inside the guard's database transaction, which
	// [Querier] hands it, so fn's statements commit or roll back with the
	// guard's own check.
	InTransaction bool
}

// A Promiser is a Guard that says what it promises. Every guard of this
// module is one.
type Promiser interface {
	Guard
	// Promises returns what the guard promises; it is the same on every
	// call.
	Promises() Promises
}

// Check checks that a call site written for a guard that promises old
// keeps every promise it may rely on when its guard is replaced by one that
// promises p. It returns nil if so, and otherwise an error that names each
// promise lost. A change of Waits alone is no loss: a waiting guard may also
// return [ErrConflict] (when ctx ends), and a fail-fast one may answer where
// the other waited, so both cases are already part of every call site's
// contract; the change is one of latency, not of correctness.
func (p Promises) Check(old Promises) error {
	var lost []string
	if old.Exclusive && !p.Exclusive {
		lost = append(lost, "fn is not exclusive: fns for one key may overlap")
	}
	if old.AtMostOnce && !p.AtMostOnce {
		lost = append(lost, "fn may run more than once per Do: its effects outside the guard's transaction must be idempotent")
	}
	if old.AcrossProcesses && !p.AcrossProcesses {
		lost = append(lost, "the guard holds within one process only")
	}
	if old.InTransaction && !p.InTransaction {
		lost = append(lost, "fn's statements no longer commit or roll back with the guard")
	}
	if lost == nil {
		return nil
	}
	return errors.New("contend: the replacement breaks promises: " + strings.Join(lost, "; "))
}

package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
)

// ErrMismatch reports a key that was used by another request: the record's
// fingerprint is not the caller's. Nothing ran. It is the client's mistake
// (a key reused for a different payload), not a lost race, so it does not
// match [contend.ErrConflict]; the HTTP middleware answers it with 422.
var ErrMismatch = errors.New("idempotency: key used by another request")

// ErrInFlight reports a key whose first call has not finished: under
// [Config.NoWait] at once, else when the call is an external one in
// another mode's hands. It matches [contend.ErrConflict]; the HTTP
// middleware answers it with 409.
var ErrInFlight = fmt.Errorf("idempotency: key in flight: %w", contend.ErrConflict)

// ErrFailed marks a final error of fn's, as the call that ran fn returns it
// (wrapping fn's error) and as every later call with the key replays it
// (with the same message, and nothing else of the original error).
var ErrFailed = errors.New("idempotency: the call failed")

// ErrReplayed is the error of the [contend.EventConflict] a call reports
// when it returns a stored answer instead of running fn. Calls never
// return it: they return the answer and replayed = true. It matches
// [contend.ErrConflict].
var ErrReplayed = fmt.Errorf("idempotency: answer replayed: %w", contend.ErrConflict)

// ErrFenced reports an external call whose answer was refused: its lease
// ended and another call took the key (or it expired and was removed)
// before the answer could be recorded. fn's external effect may have
// happened. It matches [contend.ErrLockLost].
var ErrFenced = fmt.Errorf("idempotency: lease ended, answer refused: %w", contend.ErrLockLost)

// Transient marks err, an error of fn's, as transient: the call's
// transaction rolls back, nothing is stored, and the next call with the key
// runs fn again. Errors that are not marked are final (the reading of the
// IETF Idempotency-Key draft: a retry gets "the result of the previously
// completed operation, success or an error"): fn's writes roll back, and
// the error is stored and replayed. Some errors are transient without a
// mark: see [Store.Do]. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// marked reports whether err was marked with [Transient].
func marked(err error) bool {
	var t transientError
	return errors.As(err, &t)
}

// transient reports whether fn's error err, in a transaction tx (nil in
// external mode), leaves nothing stored: marked so, ctx ended, the server
// rolled the transaction back, a lost race of another guard's, or an error
// of the database or the network, which says nothing about the request.
func transient(ctx context.Context, tx sqldb.Tx, err error) bool {
	switch {
	case marked(err), context.Cause(ctx) != nil:
		return true
	case tx != nil && tx.Err() != nil:
		return true
	case errors.Is(err, contend.ErrConflict), errors.Is(err, contend.ErrLockLost), errors.Is(err, contend.ErrClosed):
		return true
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return true
	case sqlerr.FromServer(err), errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrTxDone), errors.Is(err, sql.ErrConnDone):
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// failedError is a final error as Do returns it: fn's own on the call that
// ran fn, or only its message on a replay.
type failedError struct {
	msg string
	err error // fn's error; nil on a replay
}

func (e *failedError) Error() string { return "idempotency: the call failed: " + e.msg }

func (e *failedError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrFailed}
	}
	return []error{ErrFailed, e.err}
}

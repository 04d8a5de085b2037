// Package sqlerr classifies database errors by SQLSTATE, once, for every
// driver the library supports: lib/pq's *pq.Error and pgx's *pgconn.PgError
// both report theirs through a SQLState method, so no driver is imported here.
package sqlerr

import "errors"

// SQLSTATE codes the strategies act on.
const (
	UniqueViolation      = "23505"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	LockNotAvailable     = "55P03" // NOWAIT, and lock_timeout running out
	QueryCanceled        = "57014" // a client cancel, and statement_timeout
)

// Code returns the SQLSTATE of the first error in err's chain that has one,
// or "" when none does.
func Code(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// Is reports whether err carries one of codes.
func Is(err error, codes ...string) bool {
	c := Code(err)
	if c == "" {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// Retryable reports whether the whole transaction that failed with err may
// succeed when run again from the start: a deadlock victim or a serialization
// failure. Nothing the transaction did survives; it must be rolled back first.
func Retryable(err error) bool { return Is(err, DeadlockDetected, SerializationFailure) }

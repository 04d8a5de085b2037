package contend

import (
	"context"
	"database/sql"
	"errors"
)

// A Guard runs fn for key so that the effects of concurrent calls on key's
// state happen as if the callers took turns, for every process sharing the
// backend.
//
// Do returns fn's error unchanged, an error matching [ErrConflict] when the
// race for key was lost and the guard's policy is to give up, ctx's error when
// the caller gave up first, or the backend's error. Lock-based guards also keep
// fn itself exclusive: no two fns for one key overlap. See the package doc for
// what each guard promises.
type Guard interface {
	// Do runs fn for key under the guard's promise; see the type doc for
	// what it returns.
	Do(ctx context.Context, key string, fn func(ctx context.Context) error) error
}

// ErrConflict reports a lost race: the key is held by someone else, was already
// claimed, or its version moved, and the guard's policy is to give up. It is not
// a bug; callers usually answer it with "try again later" or "already done".
// Errors returned by this module wrap it with the key, so match it with
// [errors.Is].
var ErrConflict = errors.New("contend: conflict")

// ErrLockLost reports that a hold ended before fn returned: a lease expired or
// the backend failed. Guards that can lose a hold cancel fn's context with
// this cause (see [context.Cause]) and return it, joined with fn's error, so the
// caller knows its work may have overlapped another holder's.
var ErrLockLost = errors.New("contend: lock lost")

// ErrNotFound reports that the key has no row to guard: a missing row is not a
// lost race, and callers usually answer it differently ("no such bot" rather
// than "already running").
var ErrNotFound = errors.New("contend: not found")

// ErrInvalid reports bad input: an empty key, a non-positive duration, a nil
// client, a table or column name that is not a plain identifier. Errors that
// wrap it say which input and why.
var ErrInvalid = errors.New("contend: invalid argument")

// ErrClosed reports a call on a guard or queue after its Close, or a wait
// that Close cut short.
var ErrClosed = errors.New("contend: closed")

// DBTX is the part of database/sql that a guard's fn needs to run statements.
// [*sql.DB], [*sql.Tx], [*sql.Conn], and sqlx's DB and Tx all satisfy it, and so
// does what [Querier] returns inside a SQL guard's fn.
type DBTX interface {
	// ExecContext runs a statement that returns no rows, as [sql.DB.ExecContext].
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	// QueryContext runs a query that returns rows, as [sql.DB.QueryContext].
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	// QueryRowContext runs a query that returns at most one row, as
	// [sql.DB.QueryRowContext].
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// DB is the database handle the SQL strategies take: a database/sql handle
// (a [DBTX] such as [*sql.DB] or [*sql.Tx], or sqlx's), or a pgx
// handle wrapped by pgxdb.Wrap. It is an empty interface so that both kinds
// pass without a conversion and without this package importing a driver;
// constructors and functions that take one check it, and anything else,
// a typed nil included, is an error matching [ErrInvalid].
type DB interface{}

type querierKey struct{}

// WithQuerier returns a context that carries q as the querier fn must use.
// Guards that run fn inside their own transaction call it so that
// [Querier] hands fn that transaction; application code rarely needs it.
func WithQuerier(ctx context.Context, q DBTX) context.Context {
	return context.WithValue(ctx, querierKey{}, q)
}

// Querier returns the transaction of the guard that runs the calling fn, or
// db when ctx carries none. A guard's transaction comes as a value of the
// library's, not as the *sql.Tx itself: once the server has rolled the
// transaction back, every statement through it fails, rather than run alone
// outside it. Writing fn bodies against it lets one fn work under
// every guard: a SQL guard's writes then commit or roll back with its lock or
// version check, and under the other guards they go straight to db.
//
//	err := g.Do(ctx, "sku-1", func(ctx context.Context) error {
//		_, err := contend.Querier(ctx, db).ExecContext(ctx, "UPDATE ...")
//		return err
//	})
func Querier(ctx context.Context, db DBTX) DBTX {
	if q, ok := ctx.Value(querierKey{}).(DBTX); ok {
		return q
	}
	return db
}

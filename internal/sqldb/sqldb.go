// Package sqldb is the one interface the SQL strategies run statements
// through, so that each strategy has one code path for every driver:
// database/sql (lib/pq, pgx's stdlib driver, sqlx), implemented here, and pgx
// native, implemented in package pgxdb, the only package of the module that
// imports pgx. Its types are the standard library's, so a program that uses
// database/sql only links no pgx.
//
// The model is River's driver packages (riverdriver, with riverpgxv5 and
// riverdatabasesql beside it), cut down to what a guard does: run a
// statement, read a row, begin, commit and roll back, and hand fn its
// transaction through ctx.
package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"

	"github.com/contend/contend"
)

// Querier runs statements: a pool, a connection or a transaction.
type Querier interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	// QueryRow runs a query whose first row Scan reads; Scan returns an
	// error matching [sql.ErrNoRows] when there is none (pgx's ErrNoRows
	// wraps it).
	QueryRow(ctx context.Context, query string, args ...any) Row
	// Query runs a query and returns its rows.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Row is the answer of [Querier.QueryRow].
type Row interface {
	Scan(dest ...any) error
}

// Rows is the answer of [Querier.Query]. Close must be called.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// Tx is a transaction a guard runs fn in: one it began, or the caller's.
type Tx interface {
	Querier
	// Context returns ctx carrying the transaction for fn, where
	// [contend.Querier] (database/sql) or pgxdb.Querier (pgx) finds it.
	Context(ctx context.Context) context.Context
	// DBTX returns the transaction as database/sql's handle, the tx a
	// fn(ctx, tx contend.DBTX) is given; nil under pgx.
	DBTX() contend.DBTX
	// Err returns nil while the transaction may still commit, and else an
	// error that says the server rolled it back: every statement in it then
	// fails, and it must not be committed.
	Err() error
}

// OwnTx is a transaction a guard began and must end.
type OwnTx interface {
	Tx
	// Commit and Rollback end the transaction and give its connection back
	// to the pool. Cancelling ctx abandons the call: a driver that watches
	// ctx closes the connection instead of waiting for the server.
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Conn is a connection held for a few statements in a row.
type Conn interface {
	Querier
	// Release gives the connection back. A connection a statement may still
	// be running on must be released on a goroutine of its own: Release may
	// wait for it.
	Release()
}

// Stmt is a statement prepared once and run many times.
type Stmt interface {
	// Exec and QueryRow run the statement in tx, or, when tx is nil, on the
	// handle it was prepared on.
	Exec(ctx context.Context, tx Tx, args ...any) (int64, error)
	QueryRow(ctx context.Context, tx Tx, args ...any) Row
	Close() error
}

// DB is a caller's handle, classified: a pool the guard begins transactions
// on, or a transaction the caller owns.
type DB interface {
	Querier
	// Tx returns the caller's transaction that the handle is, or nil when
	// it is a pool.
	Tx() Tx
	// Outer returns the transaction of this driver that ctx carries (the
	// fn of another SQL guard, or [contend.WithQuerier]), or nil when it
	// carries none. A transaction of another driver, or a querier of
	// unknown kind, gives an error matching [contend.ErrInvalid]: it cannot
	// be joined, and not joining it could wait for a lock its own goroutine
	// holds.
	Outer(ctx context.Context) (Tx, error)
	// Begin begins a transaction on a pool, on a connection of its own
	// that Commit and Rollback give back. nil opts means the server's
	// defaults; only Isolation and ReadOnly are read.
	Begin(ctx context.Context, opts *sql.TxOptions) (OwnTx, error)
	// Acquire returns one connection of a pool for a few statements in a
	// row; a handle that is one connection already returns itself.
	Acquire(ctx context.Context) (Conn, error)
	// Prepare prepares query on the handle. Drivers that cache prepared
	// statements by themselves (pgx) only keep the text.
	Prepare(ctx context.Context, query string) (Stmt, error)
	// Dialect is the SQL the handle's server speaks.
	Dialect() Dialect
}

// EndsWithCtx reports whether the statements of h, a handle of this
// package's, return when their ctx ends, whatever the network does: pgx's
// do, natively or through its database/sql driver, since its context
// watcher puts a deadline on the connection at once, and so do
// go-sql-driver/mysql's, which closes the connection; lib/pq's do not. A
// statement on such a handle needs no watching (txn.Watch) to keep a call
// within its ctx.
func EndsWithCtx(h any) bool {
	e, ok := h.(interface{ StatementsEndWithCtx() bool })
	return ok && e.StatementsEndWithCtx()
}

// TxEndsWithCtx reports whether the transactions d begins end with the ctx
// they began under: their COMMIT and ROLLBACK return once that ctx is
// cancelled, whatever the network does. pgx's do, natively or through its
// database/sql driver; lib/pq's and go-sql-driver/mysql's COMMIT takes no
// ctx and waits for the server.
func TxEndsWithCtx(d DB) bool {
	e, ok := d.(interface{ TxEndsWithCtx() bool })
	return ok && e.TxEndsWithCtx()
}

// Wrapped is a handle of another driver, made by that driver's package
// (pgxdb.Wrap), that [Open] accepts.
type Wrapped interface {
	// ContendDB returns the handle classified, or an error matching
	// [contend.ErrInvalid] when the wrapped value was not a handle the
	// driver knows.
	ContendDB() (DB, error)
}

// Open classifies db, a [contend.DB], for a guard, which begins its
// transactions on it: a database/sql handle or a [Wrapped] one. nil, typed
// nils and anything else give an error matching [contend.ErrInvalid]; so
// does a database/sql handle with only [contend.DBTX]'s methods, which
// might be a pool or a transaction, and a handle that is one connection
// (a *sql.Conn, a wrapped *pgx.Conn): one server session, on which two
// calls would begin their transactions as one, where a lock keeps nobody
// out.
func Open(db contend.DB) (DB, error) {
	d, err := classify(db)
	if err != nil {
		return nil, err
	}
	if s, ok := unwrap(d).(interface{ OneSession() bool }); ok && s.OneSession() {
		return nil, fmt.Errorf("db is one connection, one server session: a guard begins a transaction per call, and "+
			"two calls on one session would run in one transaction, which a lock does not keep apart; pass the pool "+
			"(*sql.DB, sqlx's DB, a *pgxpool.Pool wrapped by pgxdb.Wrap), or a transaction of yours to run in: %w", contend.ErrInvalid)
	}
	return d, nil
}

func classify(db contend.DB) (DB, error) {
	if IsNil(db) {
		return nil, fmt.Errorf("nil db: %w", contend.ErrInvalid)
	}
	switch h := db.(type) {
	case Wrapped:
		return h.ContendDB()
	case contend.DBTX:
		return openStd(h)
	}
	return nil, fmt.Errorf("db is a %T: pass a database/sql handle (*sql.DB, *sql.Tx, sqlx's DB or Tx) "+
		"or a pgx handle wrapped by pgxdb.Wrap: %w", db, contend.ErrInvalid)
}

// IsNil reports whether db is nil or a typed nil, such as a nil [*sql.DB].
func IsNil(db any) bool {
	if db == nil {
		return true
	}
	switch v := reflect.ValueOf(db); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// Statements returns db as a [Querier] for statements run outside any
// transaction of the library's, without classifying it as a pool or a
// transaction: either will do for one statement.
func Statements(db contend.DB) (Querier, error) {
	switch h := db.(type) {
	case Wrapped:
		d, err := h.ContendDB()
		if err != nil {
			return nil, err
		}
		return d, nil
	case contend.DBTX:
		if IsNil(h) {
			break
		}
		if err := refuseBareMySQL(h); err != nil {
			return nil, err
		}
		return stdQuerier{h, pgxStdlib(h)}, nil
	}
	return classify(db) // for its error
}

type txKey struct{}

// WithTx returns ctx carrying tx, a transaction of a driver other than
// database/sql (whose transactions travel with [contend.WithQuerier]), for
// that driver's package to find with [TxFrom].
func WithTx(ctx context.Context, tx any) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns what [WithTx] put in ctx, or nil.
func TxFrom(ctx context.Context) any { return ctx.Value(txKey{}) }

// ErrOtherDriver is the error of a guard called inside a transaction of
// another driver than its own.
func ErrOtherDriver(mine, carried string) error {
	return fmt.Errorf("ctx carries a %s transaction and this handle is %s: guards on different drivers cannot "+
		"share a transaction, and nesting them could wait for a lock the caller holds: %w", carried, mine, contend.ErrInvalid)
}

// NoRows reports whether err says a query returned no row.
func NoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

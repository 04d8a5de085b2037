// Package txn runs a function inside a transaction, the one way the SQL
// strategies do: begin, commit on success, roll back on error or panic, and run
// the whole transaction again when the server says that may succeed.
package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqlerr"
)

// Beginner is a handle that can begin transactions: [*sql.DB], [*sql.Conn],
// sqlx's DB.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Options says how [Run] runs its transaction.
type Options struct {
	// Tx is passed to BeginTx; nil means the driver's defaults.
	Tx *sql.TxOptions
	// Retry bounds the attempts when a transaction fails with a retryable
	// error.
	Retry contend.Retry
	// Retryable says which errors of fn or of the commit are worth running
	// the whole transaction again for, besides deadlocks and serialization
	// failures (always retried where Run owns the transaction). Optional.
	Retryable func(error) bool
}

// Run runs fn inside a transaction on db and returns the number of attempts
// and the last error. fn's ctx carries the transaction for [contend.Querier].
//
// When db can begin transactions, Run owns the transaction: it commits when fn
// returns nil and rolls back otherwise, also on panic (re-raised). A deadlock
// or serialization failure (SQLSTATE 40P01, 40001), or an error opts.Retryable
// accepts, rolls back and runs the whole transaction again under opts.Retry:
// an aborted PostgreSQL transaction cannot go on, so nothing short of a fresh
// one can succeed.
//
// When db is already a transaction (it cannot begin one), fn runs on it once,
// Run neither commits nor rolls back, and errors are returned for the owner of
// the transaction to handle: only it can retry from the start.
func Run(ctx context.Context, db contend.DBTX, opts Options, fn func(ctx context.Context, tx contend.DBTX) error) (attempts int, err error) {
	if db == nil {
		return 0, fmt.Errorf("nil db: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return 0, fmt.Errorf("nil fn: %w", contend.ErrInvalid)
	}
	b, ok := db.(Beginner)
	if !ok {
		if err := context.Cause(ctx); err != nil {
			return 0, err
		}
		return 1, fn(contend.WithQuerier(ctx, db), db)
	}
	retryable := func(err error) bool {
		return sqlerr.Retryable(err) || (opts.Retryable != nil && opts.Retryable(err))
	}
	return opts.Retry.Do(ctx, func(ctx context.Context) error {
		return once(ctx, b, opts.Tx, fn)
	}, retryable)
}

// conner is a pool that hands out a connection of its own: [*sql.DB] and
// sqlx's DB.
type conner interface {
	Conn(ctx context.Context) (*sql.Conn, error)
}

// once runs one attempt: begin, fn, commit or roll back.
//
// database/sql rolls back a transaction whose ctx ends on a goroutine of its
// own and lets the caller go on at once: a guard could return, and its
// caller try the key again, before the server had let go of the
// transaction's locks. So the transaction is begun without ctx's
// cancellation and rolled back here, before once returns. The wait for a
// connection and fn's statements still end with ctx, and a transaction
// whose ctx ended while fn ran is rolled back, not committed.
func once(ctx context.Context, b Beginner, txOpts *sql.TxOptions, fn func(context.Context, contend.DBTX) error) (err error) {
	if p, ok := b.(conner); ok {
		conn, err := p.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		b = conn
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	tx, err := b.BeginTx(context.WithoutCancel(ctx), txOpts)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Runs on error and on panic alike.
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
	}()
	if err := fn(contend.WithQuerier(ctx, tx), tx); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	committed = true
	return nil
}

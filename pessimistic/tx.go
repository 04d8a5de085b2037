package pessimistic

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
)

// TxOptions says how [InTx] runs its transaction. The zero value is the
// server's isolation level, contend.Retry's defaults and a 5s finish bound.
type TxOptions struct {
	// Isolation is the transaction's isolation level. Default: the
	// server's, normally READ COMMITTED.
	Isolation sql.IsolationLevel
	// ReadOnly begins a read-only transaction.
	ReadOnly bool
	// Retry bounds the runs of the transaction when it fails with a
	// deadlock or a serialization failure. Default: contend.Retry's
	// defaults.
	Retry contend.Retry
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK, as
	// [LockerConfig.FinishTimeout] does. Default: 5s.
	FinishTimeout time.Duration
}

// InTx runs fn in a transaction on db and commits it when fn returns nil,
// rolling back otherwise, also when fn panics (the panic is re-raised). fn
// reaches the transaction through ctx: [contend.Querier] on a database/sql
// handle, pgxdb.Querier on a pgx one; so do the guards fn calls, which join
// it (a Locker, an Advisory, an optimistic Guard or Store, a Claimer), and
// their locks are held until it ends.
//
// A deadlock or serialization failure (SQLSTATE 40P01, 40001) rolls back
// and runs the whole transaction again, fn included, under opts.Retry: an
// aborted transaction cannot go on, and a fresh one may succeed. Keep
// effects outside the database out of fn, or make them idempotent. When the
// attempts run out, the error matches [contend.ErrConflict] and keeps the
// server's. A nil opts means the defaults.
//
// db is a pool (see [NewLocker]). When db is a transaction the caller owns, or ctx
// carries one (InTx inside a guard's fn), fn runs once in it, nothing is
// committed, and a deadlock is returned for the owner to run its
// transaction again. It returns fn's error unchanged, ctx's error when ctx
// ended first, or the backend's error.
//
//	err := pessimistic.InTx(ctx, db, nil, func(ctx context.Context) error {
//		q := contend.Querier(ctx, db)
//		if _, err := q.ExecContext(ctx, `UPDATE accounts SET balance = balance - $2 WHERE id = $1`, from, n); err != nil {
//			return err
//		}
//		_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, to, n)
//		return err
//	})
func InTx(ctx context.Context, db contend.DB, opts *TxOptions, fn func(ctx context.Context) error) error {
	d, err := sqldb.Open(db)
	if err != nil {
		return fmt.Errorf("pessimistic: in tx: %w", err)
	}
	if fn == nil {
		return fmt.Errorf("pessimistic: in tx: nil fn: %w", contend.ErrInvalid)
	}
	var o TxOptions
	if opts != nil {
		o = *opts
	}
	if o.FinishTimeout < 0 {
		return fmt.Errorf("pessimistic: in tx: finish timeout %v is negative: %w", o.FinishTimeout, contend.ErrInvalid)
	}
	to := txn.Options{Retry: o.Retry, FinishTimeout: o.FinishTimeout}
	if o.Isolation != sql.LevelDefault || o.ReadOnly {
		to.Tx = &sql.TxOptions{Isolation: o.Isolation, ReadOnly: o.ReadOnly}
	}
	h, err := txn.Resolve(ctx, d)
	if err != nil {
		return fmt.Errorf("pessimistic: in tx: %w", err)
	}
	_, err = txn.RunTx(ctx, d, to, func(ctx context.Context, _ sqldb.Tx) error { return fn(ctx) })
	if err != nil && h.Owned() && sqlerr.Retryable(err) && context.Cause(ctx) == nil {
		// The retries ran out: every run lost to another transaction.
		err = fmt.Errorf("pessimistic: in tx: deadlock or serialization failure on every run: %w (%w)", contend.ErrConflict, err)
	}
	return err
}

package pessimistic_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/pessimistic"
)

// transferBothWays has two callers lock rows "a" and "b" in opposite orders
// with nested calls of l, running step on each row once it holds it. Each
// takes its first row, says so once, and waits until the other holds its
// own: both hold one, so the cycle is certain. It returns once both calls
// succeeded, with the number of runs of their outer fns.
func transferBothWays(t *testing.T, l *pessimistic.Locker, step func(ctx context.Context, tx contend.DBTX, key string) error) int32 {
	t.Helper()
	var runs atomic.Int32
	transfer := func(first, second string, mine, theirs chan struct{}, once *sync.Once) error {
		return l.Do(t.Context(), first, func(ctx context.Context) error {
			tx := contend.Querier(ctx, nil)
			runs.Add(1)
			once.Do(func() { close(mine) })
			<-theirs // closed for good after the first run: a retry goes straight on
			if err := step(ctx, tx, first); err != nil {
				return err
			}
			return l.Do(ctx, second, func(ctx context.Context) error {
				tx := contend.Querier(ctx, nil)
				return step(ctx, tx, second)
			})
		})
	}
	aHeld, bHeld := make(chan struct{}), make(chan struct{})
	var aOnce, bOnce sync.Once
	errs := make(chan error, 2)
	go func() { errs <- transfer("a", "b", aHeld, bHeld, &aOnce) }()
	go func() { errs <- transfer("b", "a", bHeld, aHeld, &bOnce) }()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	return runs.Load()
}

// deadlockInCallersTx has two transactions of the test's own, begun on db,
// lock rows "a" and "b" in opposite orders through lockerOn's locker on
// each, and returns the error of the one the server failed, after checking
// that the other committed.
func deadlockInCallersTx(t *testing.T, db *sqlx.DB, lockerOn func(tx *sqlx.Tx) (*pessimistic.Locker, error)) error {
	t.Helper()
	ctx := t.Context()
	noop := func(context.Context) error { return nil }
	lockBoth := func(first, second string, mine, theirs chan struct{}) error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		l, err := lockerOn(tx)
		if err != nil {
			return err
		}
		if err := l.Do(ctx, first, noop); err != nil {
			return err
		}
		close(mine)
		<-theirs
		if err := l.Do(ctx, second, noop); err != nil {
			return err
		}
		return tx.Commit()
	}
	aHeld, bHeld := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() { errs <- lockBoth("a", "b", aHeld, bHeld) }()
	go func() { errs <- lockBoth("b", "a", bHeld, aHeld) }()
	victim, survivor := <-errs, <-errs
	if victim == nil {
		victim, survivor = survivor, victim
	}
	require.NoError(t, survivor, "the survivor commits")
	return victim
}

package pessimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

// TestQueueLeavesThePoolToOtherKeys: while another session holds a hot
// row, ten calls wait for it on a pool of three connections. With the local
// queue only two of them hold a connection, and a call on a cold key still
// completes; without it (the negative control) the hot key's waiters take
// the whole pool and the cold call times out (workload.HotWaiters).
func TestQueueLeavesThePoolToOtherKeys(t *testing.T) {
	workload.HotWaiters(t, func(*testing.T, *sqlx.DB) {}, func(t *testing.T, pool *sqlx.DB, queued bool) contend.Guard {
		return newLocker(t, pool, pessimistic.LockerConfig{NoLocalQueue: !queued})
	})
}

// TestQueueWaiterLeavesWhenCtxEnds: a call queued in the process behind two
// calls waiting at the server returns when its ctx ends, with the error of
// a lock wait that ctx ended, without ever taking a connection; the calls
// ahead of it go on.
func TestQueueWaiterLeavesWhenCtxEnds(t *testing.T) {
	t.Parallel()
	url := testserver.Postgres(t)
	db := testserver.Open(t, "pgx", url)
	products(t, db, 10, "hot")
	_, pid := hold(t, db, "hot")
	pool := testserver.Open(t, "pgx", url)
	l := newLocker(t, pool, pessimistic.LockerConfig{})

	errs := make(chan error, 2)
	for range 2 {
		go func() {
			errs <- l.Do(t.Context(), "hot", func(ctx context.Context) error {
				return sell(ctx, contend.Querier(ctx, pool), "hot")
			})
		}()
	}
	workload.WaitBehind(t, db, pid, 2)
	ctx, cancel := context.WithCancel(t.Context())
	ran := false
	done := make(chan error, 1)
	go func() {
		done <- l.Do(ctx, "hot", func(context.Context) error { ran = true; return nil })
	}()
	// Nothing of the third call reaches the server: cancel it, and it
	// returns, with the waiters at the server still two.
	cancel()
	err := <-done
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
	workload.WaitBehind(t, db, pid, 2)

	_, err = db.Exec(`SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, 8, stockOf(t, db, "hot"))
}

// TestNestedCallSkipsTheQueue: a call nested in fn, on the key its own
// transaction already holds, joins that transaction and never waits in the
// queue, where it would wait behind the calls that wait for itself: with
// one call waiting at the server and another queued, the nested call still
// runs at once, and every sale lands.
func TestNestedCallSkipsTheQueue(t *testing.T) {
	t.Parallel()
	url := testserver.Postgres(t)
	db := testserver.Open(t, "pgx", url)
	products(t, db, 10, "p")
	pool := testserver.Open(t, "pgx", url)
	l := newLocker(t, pool, pessimistic.LockerConfig{})
	sellP := func(ctx context.Context) error { return sell(ctx, contend.Querier(ctx, pool), "p") }

	errs := make(chan error, 2)
	err := l.Do(t.Context(), "p", func(ctx context.Context) error {
		var pid int
		if err := contend.Querier(ctx, pool).QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		go func() { errs <- l.Do(t.Context(), "p", sellP) }()
		workload.WaitBehind(t, db, pid, 1)
		go func() { errs <- l.Do(t.Context(), "p", sellP) }()
		require.Eventually(t, func() bool { return l.Queued("p") == 1 }, 10*time.Second, time.Millisecond)
		return l.Do(ctx, "p", sellP)
	})
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, 7, stockOf(t, db, "p"))
}

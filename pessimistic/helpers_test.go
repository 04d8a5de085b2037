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

// The parallel tests wait on locks, lock timeouts and ctx deadlines, each
// on a pool of a few connections: four at a time.
func TestMain(m *testing.M) { testserver.MainWaiting(m, 4) }

// products is the oversell story's table: one row per item and its stock.
func products(t testing.TB, db *sqlx.DB, stock int, ids ...string) {
	t.Helper()
	workload.Products(t, db, int64(stock), ids...)
}

func stockOf(t testing.TB, db *sqlx.DB, id string) int {
	t.Helper()
	return int(workload.Stock(t, db, id))
}

// newLocker makes a locker on db; the table defaults to products.
func newLocker(t testing.TB, db contend.DB, cfg pessimistic.LockerConfig) *pessimistic.Locker {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = "products"
	}
	l, err := pessimistic.NewLocker(db, cfg)
	require.NoError(t, err)
	return l
}

// sell is the read-check-write that needs the lock (workload.SellOn): read
// the stock, refuse when none is left, write back the stock read minus one.
// Without a lock, two sellers read the same stock and one sale is lost.
var sell = workload.SellOn

// hold locks id's row in a transaction of the test's own, as another
// process would, and returns it with its backend's pid. The row stays locked
// until the test ends the transaction (it is rolled back when t ends).
func hold(t testing.TB, db *sqlx.DB, id string) (*sqlx.Tx, int) {
	t.Helper()
	tx, err := db.Beginx()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var pid int
	require.NoError(t, tx.Get(&pid, `SELECT pg_backend_pid() FROM products WHERE id = $1 FOR UPDATE`, id))
	return tx, pid
}

// waitBlocked waits until n sessions wait for a lock that the session pid
// holds: the signal that a waiter is queued, from the server itself.
func waitBlocked(t testing.TB, db *sqlx.DB, pid, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid)
		return err == nil && waiting == n
	}, 10*time.Second, 2*time.Millisecond, "%d sessions never queued behind %d", n, pid)
}

// requireFree checks that nobody holds id's row: a NOWAIT lock gets it.
func requireFree(t testing.TB, db *sqlx.DB, id string) {
	t.Helper()
	l := newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait})
	require.NoError(t, l.Do(t.Context(), id, func(context.Context) error { return nil }), "%s is still locked", id)
}

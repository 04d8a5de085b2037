package workload

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
)

// HotWaiters is a hot key's waiters beside a call on a cold key, for a
// guard that waits for a row lock, run twice: with the guard queueing its
// waiters in the process, and without (the negative control). While another
// session holds the products row "hot", ten calls of this process sell it
// through the guard on a pool of three connections, then one call sells
// "cold". Queued, only two of the waiters hold a connection, and the cold
// call gets the third and completes; not queued, the waiters take the
// whole pool and the cold call times out waiting for a connection. Once
// the holder is gone, every hot call completes and no sale is lost. setup
// adds what the guard needs to the products table (rows "hot" and "cold",
// stock 100); guard makes the guard on the pool it is given.
func HotWaiters(t *testing.T, setup func(t *testing.T, db *sqlx.DB), guard func(t *testing.T, pool *sqlx.DB, queued bool) contend.Guard) {
	t.Parallel()
	for _, queued := range []bool{true, false} {
		t.Run(fmt.Sprintf("queued=%v", queued), func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, "pgx", url)
			Products(t, db, 100, "hot", "cold")
			setup(t, db)
			hotWaiters(t, url, db, queued, func(pool *sqlx.DB) contend.Guard { return guard(t, pool, queued) })
		})
	}
}

func hotWaiters(t *testing.T, url string, db *sqlx.DB, queued bool, guard func(pool *sqlx.DB) contend.Guard) {
	t.Helper()
	pid := HoldRow(t, db, "products", "hot")
	pool := testserver.Open(t, "pgx", url)
	pool.SetMaxOpenConns(3)
	// Every connection dialled before the race, so that the cold call's
	// deadline is spent waiting for one, not connecting.
	var conns []*sqlx.Conn
	for range 3 {
		c, err := pool.Connx(t.Context())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	g := guard(pool)
	sell := Guarded(g, Sell(pool))

	const hot = 10
	errs := make(chan error, hot)
	var wg sync.WaitGroup
	for range hot {
		wg.Go(func() { errs <- sell(t.Context(), "hot") })
	}
	atServer := 2
	if !queued {
		atServer = 3
	}
	WaitBehind(t, db, pid, atServer)
	if !queued {
		require.Eventually(t, func() bool { return pool.Stats().WaitCount > 0 }, 10*time.Second, time.Millisecond,
			"the hot calls never waited for a connection")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := sell(ctx, "cold")
	if queued {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, context.DeadlineExceeded, "the cold call got a connection past the hot waiters")
	}
	WaitBehind(t, db, pid, atServer) // the hot key's waiters are still just these

	_, err = db.Exec(`SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(100-hot), Stock(t, db, "hot"))
}

// HoldRow locks the row of table whose id is id in a transaction of the
// test's own, as another process would, and returns its backend's pid. The
// row stays locked until that session ends (the transaction is rolled back
// when t ends). table is the program's, never input.
func HoldRow(t testing.TB, db *sqlx.DB, table, id string) int {
	t.Helper()
	tx, err := db.Beginx()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var pid int
	require.NoError(t, tx.Get(&pid, `SELECT pg_backend_pid() FROM `+table+` WHERE id = $1 FOR UPDATE`, id))
	return pid
}

// WaitBehind waits until n sessions wait, directly or through one another,
// behind the session pid. PostgreSQL queues a row's waiters behind the
// first of them (it holds the tuple lock, and waits for the holder), so
// only the first is blocked by the holder itself.
func WaitBehind(t testing.TB, db *sqlx.DB, pid, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := db.Get(&waiting, `WITH RECURSIVE behind(pid) AS (
				SELECT $1::int
				UNION SELECT a.pid FROM pg_stat_activity a, behind b WHERE b.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT count(*) - 1 FROM behind`, pid)
		return err == nil && waiting == n
	}, 10*time.Second, 2*time.Millisecond, "%d sessions never queued behind %d", n, pid)
}

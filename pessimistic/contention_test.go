package pessimistic_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

const initialStock = 300

// load is the oversell story at scale: 64 goroutines in each of 3 processes
// run sell on one hot row of stock 300, 384 attempts in all. The race that
// oversells is every seller against every other, which 192 sellers make
// from the first sale to the last; a larger stock only makes the queue
// for the row longer.
var load = harness.Config{Processes: 3, Goroutines: 64, Ops: 2}

// workerConns caps each worker process's pool: the 64 goroutines of a
// process still contend (they queue for a connection, then for the row), and
// three processes stay well inside the server's connection limit, which
// other tests share.
const workerConns = 8

// sellUnderLoad runs sell on the hot row from load's goroutines and
// processes, each sale in a transaction that sellIn makes, and returns the
// outcome and the stock left.
func sellUnderLoad(t *testing.T, driver string, sellIn func(t testing.TB, db contend.DB) harness.Op) (harness.Result, int) {
	t.Helper()
	var db *sqlx.DB
	res := harness.Run(t, load,
		func() harness.Params {
			url := testserver.Postgres(t)
			db = testserver.Open(t, driver, url)
			products(t, db, initialStock, "hot")
			return harness.Params{"url": url}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			if driver == testserver.PgxNative {
				return sellIn(t, testserver.Handle(t, driver, p["url"]))
			}
			db := testserver.Open(t, driver, p["url"])
			db.SetMaxOpenConns(workerConns)
			return sellIn(t, db)
		})
	left := stockOf(t, db, "hot")
	t.Logf("sold %d, refused %d, errors %d, stock left %d, p50 %v, p99 %v",
		res.Successes, res.Conflicts, res.Errors, left, res.Percentile(.5), res.Percentile(.99))
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.GreaterOrEqual(t, left, 0, "oversold")
	return res, left
}

// Waiting for the lock: every sale reads the stock the previous one wrote,
// so exactly the stock is sold, across processes.
func TestSellUnderContention(t *testing.T) {
	for _, driver := range testserver.PathDrivers {
		t.Run(driver, func(t *testing.T) {
			res, left := sellUnderLoad(t, driver, func(t testing.TB, db contend.DB) harness.Op {
				l := newLocker(t, db, pessimistic.LockerConfig{})
				return func(ctx context.Context, key string) error {
					return l.Do(ctx, key, func(ctx context.Context) error {
						return workload.SellVia(ctx, testserver.Querier(ctx, db), key)
					})
				}
			})
			require.Equal(t, initialStock, res.Successes)
			require.Equal(t, load.Processes*load.Goroutines*load.Ops-initialStock, res.Conflicts, "the rest find it sold out")
			require.Equal(t, 0, left)
		})
	}
}

// NOWAIT: losers give up with ErrConflict instead of queueing; whatever was
// sold was sold exactly once, and nothing half-done remains.
func TestSellUnderContentionNoWait(t *testing.T) {
	res, left := sellUnderLoad(t, "pgx", func(t testing.TB, db contend.DB) harness.Op {
		l := newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait})
		return func(ctx context.Context, key string) error {
			return l.Do(ctx, key, func(ctx context.Context) error { return workload.SellVia(ctx, testserver.Querier(ctx, db), key) })
		}
	})
	require.Positive(t, res.Successes)
	require.Positive(t, res.Conflicts, "NOWAIT losers must get ErrConflict")
	require.Equal(t, initialStock-left, res.Successes, "every success, and only they, took one off the stock")
}

// The negative control: the same read-check-write in a plain transaction,
// without the lock, under the same load, loses sales (two sellers read the
// same stock and write the same value), so the checks above can fail. One
// driver is enough: without the lock, sales are lost whatever the driver.
func TestSellWithoutLockLosesUpdates(t *testing.T) {
	for _, driver := range []string{testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			res, left := sellUnderLoad(t, driver, func(t testing.TB, db contend.DB) harness.Op {
				// A plain transaction of the test's own, on either driver:
				// InTx with no retries, and no lock.
				once := &pessimistic.TxOptions{Retry: contend.Retry{MaxAttempts: 1}}
				return func(ctx context.Context, key string) error {
					return pessimistic.InTx(ctx, db, once, func(ctx context.Context) error {
						return workload.SellVia(ctx, testserver.Querier(ctx, db), key)
					})
				}
			})
			require.Greater(t, res.Successes, initialStock-left, "without the lock some sales must be lost")
			t.Logf("%d sales recorded, %d taken off the stock: %d lost", res.Successes, initialStock-left, res.Successes-(initialStock-left))
		})
	}
}

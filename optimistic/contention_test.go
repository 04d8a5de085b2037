package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
)

// The contention tests run 64 goroutines in each of 3 processes against one
// hot row. Each worker's pool has workerConns connections: the goroutines
// queue for them, so 24 statements race at any moment and all 192 goroutines
// race between their reads and writes, while the shared server keeps
// connections for everyone else's tests.
const workerConns = 8

func workerDB(t testing.TB, driver, url string) *sqlx.DB {
	db := testserver.Open(t, driver, url)
	db.SetMaxOpenConns(workerConns)
	return db
}

// workerHandle is what a worker builds its subject on: workerDB, or under
// pgx-native a pgx pool (of testserver.MaxConns connections).
func workerHandle(t testing.TB, driver, url string) contend.DB {
	if driver == testserver.PgxNative {
		return testserver.Handle(t, driver, url)
	}
	return workerDB(t, driver, url)
}

type counter struct {
	ID      string `db:"id"`
	N       int64  `db:"n"`
	Version int64  `db:"version"`
}

func counters(t testing.TB, db *sqlx.DB) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE counters (id text PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL DEFAULT 0);
		INSERT INTO counters (id, n) VALUES ('hot', 0)`)
	require.NoError(t, err)
}

func counted(t testing.TB, db *sqlx.DB) counter {
	t.Helper()
	var c counter
	require.NoError(t, db.Get(&c, `SELECT * FROM counters WHERE id = 'hot'`))
	return c
}

// increments runs Store.Update's increment of the hot counter under cfg with
// the given retry budget, and returns the outcome and the row.
func increments(t *testing.T, driver string, cfg harness.Config, retry contend.Retry) (harness.Result, counter) {
	var db *sqlx.DB
	res := harness.Run(t, cfg,
		func() harness.Params {
			url := testserver.Postgres(t)
			db = testserver.Open(t, driver, url)
			counters(t, db)
			return harness.Params{"url": url}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			s, err := optimistic.NewStore[counter](workerHandle(t, driver, p["url"]), optimistic.Config{Table: "counters", Retry: retry})
			require.NoError(t, err)
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(c *counter) error { c.N++; return nil })
				return err
			}
		})
	c := counted(t, db)
	t.Logf("successes %d, conflicts %d, errors %d, counter %d, version %d, p50 %v, p99 %v, %.0f ops/s",
		res.Successes, res.Conflicts, res.Errors, c.N, c.Version, res.Percentile(.5), res.Percentile(.99), res.Throughput())
	return res, c
}

// 768 increments of one counter, from 64 goroutines × 3 processes, through
// Store.Update, with a retry budget large enough that nobody gives up: every
// increment lands, none is lost, none is refused.
//
// One driver: a hot row is this strategy's worst case (most attempts lose),
// so the run takes a while; TestBalanceNeverNegative puts the other driver
// under the same load.
func TestUpdateCounterUnderContention(t *testing.T) {
	const total = 3 * 64 * 4
	res, c := increments(t, "pgx", harness.Config{Processes: 3, Goroutines: 64, Total: total}, bigBudget)
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Zero(t, res.Conflicts, "a large retry budget never gives up")
	require.Equal(t, total, res.Successes)
	require.EqualValues(t, res.Successes, c.N, "lost updates")
	require.EqualValues(t, res.Successes, c.Version, "one version per write")
}

// With two attempts per update, losers give up with ErrConflict under the
// same load, and still no update is lost: every success is counted, no
// conflict is. On pgx native: TestUpdateCounterUnderContention runs the
// database/sql path under this load.
func TestSmallRetryBudgetConflicts(t *testing.T) {
	for _, driver := range []string{testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			res, c := increments(t, driver, harness.Config{Processes: 3, Goroutines: 64, Ops: 4}, contend.Retry{MaxAttempts: 2})
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Positive(t, res.Conflicts, "a budget of 2 attempts runs out on a hot row")
			require.Positive(t, res.Successes)
			require.EqualValues(t, res.Successes, c.N, "lost updates")
		})
	}
}

var errInsufficient = errors.New("insufficient funds")

// Withdrawals of 7 from a balance of 1000 by 64 goroutines × 3 processes: fn
// refuses to go below zero, and since every decision is made on the current
// balance, the balance ends at 1000 − 7 × withdrawals, never below zero, and
// too low for one more.
func TestBalanceNeverNegative(t *testing.T) {
	const (
		initial = 1000
		amount  = 7
	)
	driver := "postgres"
	var db *sqlx.DB
	res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 64, Ops: 2},
		func() harness.Params {
			url := testserver.Postgres(t)
			db = testserver.Open(t, driver, url)
			accounts(t, db)
			_, err := db.Exec(`INSERT INTO accounts (id, balance) VALUES ('hot', $1)`, initial)
			require.NoError(t, err)
			return harness.Params{"url": url}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			db := workerDB(t, driver, p["url"])
			s := accountStore(t, db, optimistic.Config{Table: "accounts", Retry: bigBudget})
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(a *account) error {
					if a.Balance < amount {
						return errInsufficient
					}
					a.Balance -= amount
					return nil
				})
				switch {
				case errors.Is(err, errInsufficient):
					return fmt.Errorf("refused: %w", contend.ErrConflict)
				case errors.Is(err, contend.ErrConflict):
					return fmt.Errorf("version conflict despite the budget: %v", err) // an error, not a refusal
				}
				return err
			}
		})
	final := rowOf(t, db, "hot").Balance
	t.Logf("withdrawals %d, refused %d, errors %d, balance %d, p50 %v, p99 %v",
		res.Successes, res.Conflicts, res.Errors, final, res.Percentile(.5), res.Percentile(.99))
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Equal(t, initial/amount, res.Successes, "every withdrawal the balance allowed went through")
	require.Equal(t, 3*64*2-initial/amount, res.Conflicts)
	require.EqualValues(t, initial-amount*res.Successes, final)
	require.GreaterOrEqual(t, final, int64(0))
	require.Less(t, final, int64(amount))
}

// The negative control: the same increment as a plain read then a write of
// read+1, without the version check, under the same load, loses updates. If it
// did not, the tests above could not fail. One driver is enough: the naive
// way loses updates whatever the driver.
func TestNaiveReadModifyWriteLosesUpdates(t *testing.T) {
	for _, driver := range []string{testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			var db *sqlx.DB
			res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 64, Ops: 4},
				func() harness.Params {
					url := testserver.Postgres(t)
					db = testserver.Open(t, driver, url)
					counters(t, db)
					return harness.Params{"url": url}
				},
				func(t testing.TB, p harness.Params) harness.Op {
					h := workerHandle(t, driver, p["url"])
					return func(ctx context.Context, key string) error {
						q := testserver.Querier(ctx, h)
						var n int64
						if err := q.QueryRow(ctx, `SELECT n FROM counters WHERE id = $1`, key).Scan(&n); err != nil {
							return err
						}
						_, err := q.Exec(ctx, `UPDATE counters SET n = $2 WHERE id = $1`, key, n+1)
						return err
					}
				})
			c := counted(t, db)
			t.Logf("successes %d, counter %d: %d updates lost", res.Successes, c.N, int64(res.Successes)-c.N)
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Equal(t, 3*64*4, res.Successes)
			require.Less(t, c.N, int64(res.Successes), "the unchecked read-modify-write lost no update: the load is too weak to show anything")
		})
	}
}

package adaptive_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// The contention tests run 64 goroutines in each of 3 processes against one
// hot row. Each worker's pool has workerConns connections (a pgx-native one
// testserver.MaxConns), so goroutines queue for them, while the shared server
// keeps connections for everyone else's tests.
const workerConns = 8

func workerHandle(t testing.TB, driver, url string) contend.DB {
	if driver == testserver.PgxNative {
		return testserver.Handle(t, driver, url)
	}
	db := testserver.Open(t, driver, url)
	db.SetMaxOpenConns(workerConns)
	return db
}

// hotCounter makes the counters table with the hot row, and the table fn
// counts its commits by mode in, for a test's setup.
func hotCounter(t testing.TB, driver string) (*sqlx.DB, harness.Params) {
	url := testserver.Postgres(t)
	db := testserver.Open(t, driver, url)
	counters(t, db, "hot")
	_, err := db.Exec(`CREATE TABLE commits (mode text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
		INSERT INTO commits (mode) VALUES ('optimistic'), ('pessimistic')`)
	require.NoError(t, err)
	return db, harness.Params{"url": url}
}

// incrementIn is the read-modify-write of the contention tests, on any
// driver's handle h: read the counter, pause so that calls overlap, write it
// back plus one. When mode is set, it also counts the commit under mode, in
// the same transaction.
func incrementIn(ctx context.Context, h contend.DB, key, mode string, pause time.Duration) error {
	q := testserver.Querier(ctx, h)
	var n int64
	if err := q.QueryRow(ctx, `SELECT n FROM counters WHERE id = $1`, key).Scan(&n); err != nil {
		return err
	}
	time.Sleep(pause)
	if _, err := q.Exec(ctx, `UPDATE counters SET n = $2 WHERE id = $1`, key, n+1); err != nil {
		return err
	}
	if mode == "" {
		return nil
	}
	_, err := q.Exec(ctx, `UPDATE commits SET n = n + 1 WHERE mode = $1`, mode)
	return err
}

func commits(t testing.TB, db *sqlx.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Query(`SELECT mode, n FROM commits`)
	require.NoError(t, err)
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var mode string
		var n int64
		require.NoError(t, rows.Scan(&mode, &n))
		m[mode] = n
	}
	require.NoError(t, rows.Err())
	return m
}

func logRun(t *testing.T, res harness.Result, c counter) {
	t.Logf("successes %d, conflicts %d, errors %d, counter %d, version %d, p50 %v, p99 %v, %.0f ops/s",
		res.Successes, res.Conflicts, res.Errors, c.N, c.Version, res.Percentile(.5), res.Percentile(.99), res.Throughput())
}

// 768 increments of one counter from 64 goroutines × 3 processes (the load
// under which the naive increment loses updates), each process's guard
// deciding for itself when the key went hot: every increment lands, none is
// lost, each moved the version once. On pgx native; the mixed-mode tests
// run on database/sql.
func TestNoLostUpdateUnderContention(t *testing.T) {
	for _, driver := range []string{testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			const total = 3 * 64 * 4
			var db *sqlx.DB
			res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 64, Total: total},
				func() harness.Params {
					var p harness.Params
					db, p = hotCounter(t, driver)
					return p
				},
				func(t testing.TB, p harness.Params) harness.Op {
					h := workerHandle(t, driver, p["url"])
					g := newGuard(t, h, adaptive.Config{Retry: bigBudget})
					return func(ctx context.Context, key string) error {
						return g.Do(ctx, key, func(ctx context.Context) error {
							return incrementIn(ctx, h, key, "", 0)
						})
					}
				})
			c := counted(t, db, "hot")
			logRun(t, res, c)
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Zero(t, res.Conflicts, "a large retry budget never gives up")
			require.Equal(t, total, res.Successes)
			require.EqualValues(t, res.Successes, c.N, "lost updates")
			require.EqualValues(t, res.Successes, c.Version, "one version per write")
		})
	}
}

// mixedOps is how many calls each goroutine of mixed makes.
const mixedOps = 4

// mixed runs increments on the hot key from 32 goroutines × 3 processes,
// every other call of each process through a guard pinned optimistic and the
// others through one pinned pessimistic, so the two modes race on one key
// all the time. skipBump makes the locked path lock without moving the
// version.
func mixed(t *testing.T, driver string, skipBump bool) (harness.Result, counter, map[string]int64) {
	var db *sqlx.DB
	res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 32, Ops: mixedOps},
		func() harness.Params {
			var p harness.Params
			db, p = hotCounter(t, driver)
			return p
		},
		func(t testing.TB, p harness.Params) harness.Op {
			h := workerHandle(t, driver, p["url"])
			opt := newGuard(t, h, adaptive.Config{Retry: bigBudget})
			opt.Pin(adaptive.Optimistic)
			pess := newGuard(t, h, adaptive.Config{Retry: bigBudget})
			pess.Pin(adaptive.Pessimistic)
			if skipBump {
				pess.SkipBump()
			}
			var calls atomic.Int64
			return func(ctx context.Context, key string) error {
				g, mode := opt, "optimistic"
				if calls.Add(1)%2 == 0 {
					g, mode = pess, "pessimistic"
				}
				return g.Do(ctx, key, func(ctx context.Context) error {
					return incrementIn(ctx, h, key, mode, 200*time.Microsecond)
				})
			}
		})
	c := counted(t, db, "hot")
	by := commits(t, db)
	logRun(t, res, c)
	t.Logf("commits by mode: %v", by)
	return res, c, by
}

// Optimistic and locked calls racing on one key lose no update: the locked
// path's bump is what an optimistic check sees.
func TestMixedModesLoseNoUpdate(t *testing.T) {
	for _, driver := range []string{"pgx"} {
		t.Run(driver, func(t *testing.T) {
			res, c, by := mixed(t, driver, false)
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Zero(t, res.Conflicts)
			require.Equal(t, 3*32*mixedOps, res.Successes)
			require.EqualValues(t, res.Successes, c.N, "lost updates")
			require.EqualValues(t, res.Successes, c.Version, "one version per write")
			require.EqualValues(t, res.Successes/2, by["optimistic"])
			require.EqualValues(t, res.Successes/2, by["pessimistic"])
		})
	}
}

// The negative control of TestMixedModesLoseNoUpdate: when the locked path
// locks the row without moving the version, an optimistic call that read
// before a locked one committed still finds its version and commits its
// stale write. Updates are lost, so the bump is what makes mixing safe.
func TestMixedModesWithoutBumpLoseUpdates(t *testing.T) {
	res, c, by := mixed(t, "pgx", true)
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Equal(t, 3*32*mixedOps, res.Successes)
	require.Positive(t, by["optimistic"])
	require.Positive(t, by["pessimistic"])
	require.Less(t, c.N, int64(res.Successes), "no update lost without the bump: the load is too weak to show anything")
}

// The negative control of the contention tests: the same increment as a
// plain read then write, unguarded, under the same load, loses updates. If
// it did not, they could not fail.
func TestNaiveReadModifyWriteLosesUpdates(t *testing.T) {
	const driver = "pgx"
	var db *sqlx.DB
	res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 64, Ops: 4},
		func() harness.Params {
			var p harness.Params
			db, p = hotCounter(t, driver)
			return p
		},
		func(t testing.TB, p harness.Params) harness.Op {
			h := workerHandle(t, driver, p["url"])
			return func(ctx context.Context, key string) error {
				return incrementIn(ctx, h, key, "", 0)
			}
		})
	c := counted(t, db, "hot")
	logRun(t, res, c)
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Equal(t, 3*64*4, res.Successes)
	require.Less(t, c.N, int64(res.Successes), "the unguarded read-modify-write lost no update: the load is too weak to show anything")
}

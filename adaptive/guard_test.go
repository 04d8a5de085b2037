package adaptive_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// bigBudget is a retry budget no test run exhausts: losers back off and try
// again until they win.
var bigBudget = contend.Retry{MaxAttempts: 10_000, MaxDelay: 20 * time.Millisecond}

// guardSuite puts the guard's version on the conformance suite's counter rows.
// The suite's contention runs turn their keys hot, so both modes, and the
// switch between them, run under it.
func guardSuite(driver string, pin *adaptive.Mode) guardtest.Suite {
	locked := pin != nil && *pin == adaptive.Pessimistic
	return guardtest.Suite{
		Driver: driver,
		Setup: func(t testing.TB, env guardtest.Env, _ []string) {
			_, err := env.DB.Exec(`ALTER TABLE guardtest_counters ADD COLUMN version bigint NOT NULL DEFAULT 0`)
			require.NoError(t, err)
		},
		NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
			g, err := adaptive.NewGuard(db, adaptive.Config{Table: "guardtest_counters", KeyColumn: "key", Retry: bigBudget})
			if err != nil || pin == nil {
				return g, err
			}
			g.Pin(*pin)
			if locked {
				return lockedOnly{g}, nil
			}
			return g, nil
		},
		// Optimistic calls overlap, so the guard is not exclusive; it waits
		// for the lock, or retries, rather than failing fast. Pinned locked,
		// it is exclusive, and the suite checks that too.
		FailFast:  false,
		Exclusive: locked,
	}
}

// lockedOnly is a Guard whose every call runs locked: fn is then exclusive,
// a promise the adaptive guard cannot make.
type lockedOnly struct{ *adaptive.Guard }

func (g lockedOnly) Promises() contend.Promises {
	p := g.Guard.Promises()
	p.Exclusive = true
	return p
}

// The whole Guard contract, on each code path (database/sql, pgx native), as
// the guard adapts; and once with every call locked, on the other
// database/sql driver, so the locked path is checked on its own too,
// exclusion included.
func TestGuardIsAGuard(t *testing.T) {
	for _, driver := range testserver.PathDrivers {
		t.Run(driver, func(t *testing.T) {
			guardtest.Run(t, guardSuite(driver, nil))
		})
	}
	t.Run("locked/pgx", func(t *testing.T) {
		m := adaptive.Pessimistic
		guardtest.Run(t, guardSuite("pgx", &m))
	})
}

// counters makes the counters table: one row per key, its count and version.
func counters(t testing.TB, db *sqlx.DB, keys ...string) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE counters (id text PRIMARY KEY, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	for _, k := range keys {
		_, err := db.Exec(`INSERT INTO counters (id) VALUES ($1)`, k)
		require.NoError(t, err)
	}
}

type counter struct {
	ID      string `db:"id"`
	N       int64  `db:"n"`
	Version int64  `db:"version"`
}

func counted(t testing.TB, db *sqlx.DB, key string) counter {
	t.Helper()
	var c counter
	require.NoError(t, db.Get(&c, `SELECT * FROM counters WHERE id = $1`, key))
	return c
}

// increment is a fn that adds 1 to key's counter by reading it and writing
// it back, through the guard's transaction, pausing in between for pause so
// that concurrent calls overlap.
func increment(db contend.DBTX, key string, pause time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var n int64
		if err := q.QueryRowContext(ctx, `SELECT n FROM counters WHERE id = $1`, key).Scan(&n); err != nil {
			return err
		}
		if pause > 0 {
			time.Sleep(pause)
		}
		_, err := q.ExecContext(ctx, `UPDATE counters SET n = $2 WHERE id = $1`, key, n+1)
		return err
	}
}

func newGuard(t testing.TB, db contend.DB, cfg adaptive.Config) *adaptive.Guard {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = "counters"
	}
	g, err := adaptive.NewGuard(db, cfg)
	require.NoError(t, err)
	return g
}

// Both modes do the same thing to the row, and each moves the version once
// per commit; fn's error and a missing row come back as they are.
func TestDoInEachMode(t *testing.T) {
	for _, driver := range testserver.Drivers {
		for _, m := range []adaptive.Mode{adaptive.Optimistic, adaptive.Pessimistic} {
			t.Run(driver+"/"+m.String(), func(t *testing.T) {
				t.Parallel()
				db := testserver.DB(t, driver)
				counters(t, db, "a")
				g := newGuard(t, db, adaptive.Config{})
				g.Pin(m)
				ctx := t.Context()

				require.NoError(t, g.Do(ctx, "a", increment(db, "a", 0)))
				require.Equal(t, counter{ID: "a", N: 1, Version: 1}, counted(t, db, "a"))

				sentinel := errors.New("fn failed")
				err := g.Do(ctx, "a", func(ctx context.Context) error {
					require.NoError(t, increment(db, "a", 0)(ctx))
					return sentinel
				})
				require.Equal(t, sentinel, err)
				require.Equal(t, counter{ID: "a", N: 1, Version: 1}, counted(t, db, "a"), "fn's writes and the bump roll back")

				err = g.Do(ctx, "ghost", func(context.Context) error { t.Error("fn ran for a missing row"); return nil })
				require.ErrorIs(t, err, contend.ErrNotFound)
				require.NotErrorIs(t, err, contend.ErrConflict)
			})
		}
	}
}

func TestNewGuardRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	for _, cfg := range []adaptive.Config{
		{},
		{Table: "x; DROP TABLE y"},
		{Table: "t", KeyColumn: "v", VersionColumn: "v"},
		{Table: "t", Keys: -1},
		{Table: "t", FinishTimeout: -time.Second},
	} {
		_, err := adaptive.NewGuard(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, "%+v", cfg)
	}
	_, err := adaptive.NewGuard(nil, adaptive.Config{Table: "t"})
	require.ErrorIs(t, err, contend.ErrInvalid)
}

// TestLockedQueueLeavesThePoolToOtherKeys: the locked path's waiters for a
// hot row queue in the process, so that a call on a cold key still gets a
// connection of a small pool; without the queue (the negative control) it
// times out waiting for one (workload.HotWaiters).
func TestLockedQueueLeavesThePoolToOtherKeys(t *testing.T) {
	workload.HotWaiters(t, func(t *testing.T, db *sqlx.DB) {
		_, err := db.Exec(`ALTER TABLE products ADD COLUMN version bigint NOT NULL DEFAULT 0`)
		require.NoError(t, err)
	}, func(t *testing.T, pool *sqlx.DB, queued bool) contend.Guard {
		g := newGuard(t, pool, adaptive.Config{Table: "products", NoLocalQueue: !queued})
		g.Pin(adaptive.Pessimistic)
		return g
	})
}

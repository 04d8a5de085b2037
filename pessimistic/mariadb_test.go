package pessimistic_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

// The tests of this file run on MariaDB, through go-sql-driver/mysql.

// mariaRows creates table with one row per key and a counter.
func mariaRows(t testing.TB, db *sqlx.DB, table string, keys ...string) {
	t.Helper()
	workload.MariaDBTable(t, db, table, "n bigint NOT NULL DEFAULT 0", keys...)
}

func TestLockerIsAGuardOnMariaDB(t *testing.T) {
	for _, mode := range []pessimistic.OnHeld{pessimistic.Wait, pessimistic.NoWait} {
		t.Run(mode.String(), func(t *testing.T) {
			guardtest.Run(t, guardtest.Suite{
				Driver: testserver.MariaDBDriver,
				Setup:  func(t testing.TB, env guardtest.Env, keys []string) { mariaRows(t, env.DB, "locks", keys...) },
				NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
					return pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "locks", OnHeld: mode})
				},
				FailFast:  mode != pessimistic.Wait,
				Exclusive: true,
				Ops:       8, // a hot key's waiters queue one by one: keep the run short
			})
		})
	}
}

// A lock nested in another lock's fn joins its transaction, which has read
// before the inner lock was had. Under InnoDB's REPEATABLE READ that read
// fixed the snapshot, and the inner fn's plain read of its locked row sees
// the row as it was then: the read-pause-write of a counter from 3
// processes loses updates (the negative control). The locker's own
// transactions run at READ COMMITTED, where the same calls lose none.
func TestNestedLockReadsTheLatestCommitOnMariaDB(t *testing.T) {
	const outers = 200
	for _, c := range []struct {
		name      string
		isolation sql.IsolationLevel
		loses     bool
	}{
		{"default", sql.LevelDefault, false},
		{"repeatable_read_control", sql.LevelRepeatableRead, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var db *sqlx.DB
			res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 8, Ops: 4},
				func() harness.Params {
					url := testserver.MariaDB(t)
					db = testserver.Open(t, testserver.MariaDBDriver, url)
					outer := make([]string, outers)
					for i := range outer {
						outer[i] = "o" + strconv.Itoa(i)
					}
					mariaRows(t, db, "outers", outer...)
					mariaRows(t, db, "counters", "hot")
					return harness.Params{"url": url}
				},
				func(t testing.TB, p harness.Params) harness.Op {
					h := testserver.Handle(t, testserver.MariaDBDriver, p["url"]).(testserver.MariaDBHandle)
					outer, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "outers", Isolation: c.isolation})
					require.NoError(t, err)
					inner, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "counters"})
					require.NoError(t, err)
					return func(ctx context.Context, key string) error {
						// Outer rows are many, so that the outer locks keep
						// few callers apart: the inner lock does the work.
						return outer.Do(ctx, "o"+strconv.Itoa(rand.IntN(outers)), func(ctx context.Context) error {
							q := contend.Querier(ctx, h.DB)
							var n int64
							if err := q.QueryRowContext(ctx, "SELECT count(*) FROM outers").Scan(&n); err != nil {
								return err
							}
							time.Sleep(time.Millisecond) // others commit to the counter meanwhile
							return inner.Do(ctx, key, func(ctx context.Context) error {
								q := contend.Querier(ctx, h.DB)
								if err := q.QueryRowContext(ctx, "SELECT n FROM counters WHERE id = ?", key).Scan(&n); err != nil {
									return err
								}
								time.Sleep(time.Millisecond)
								_, err := q.ExecContext(ctx, "UPDATE counters SET n = ? WHERE id = ?", n+1, key)
								return err
							})
						})
					}
				})
			var n int
			require.NoError(t, db.Get(&n, "SELECT n FROM counters WHERE id = 'hot'"))
			t.Logf("successes %d, counted %d, errors %d, p99 %v", res.Successes, n, res.Errors, res.Percentile(.99))
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			if c.loses {
				require.Less(t, n, res.Successes, "REPEATABLE READ lost no update: the test cannot see a stale read")
				return
			}
			require.Equal(t, res.Successes, n, "lost updates")
		})
	}
}

// LockMany locks a list of keys in key order, one placeholder per key;
// Claim takes free rows with SKIP LOCKED; a missing row is ErrNotFound and a
// held one under NOWAIT ErrConflict.
func TestLockManyAndClaimOnMariaDB(t *testing.T) {
	t.Parallel()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	mariaRows(t, h.DB, "jobs", "a", "b", "c")
	ctx := t.Context()
	l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "jobs"})
	require.NoError(t, err)
	err = l.LockMany(ctx, []string{"c", "a", "c"}, func(_ context.Context, _ contend.DBTX, locked []string) error {
		require.Equal(t, []string{"a", "c"}, locked)
		return nil
	})
	require.NoError(t, err)
	err = l.LockMany(ctx, []string{"a", "zz"}, func(context.Context, contend.DBTX, []string) error { return nil })
	require.ErrorIs(t, err, contend.ErrNotFound)
	require.ErrorIs(t, l.Do(ctx, "ghost", func(context.Context) error { return nil }), contend.ErrNotFound)

	nowait, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "jobs", OnHeld: pessimistic.NoWait})
	require.NoError(t, err)
	err = l.Do(ctx, "a", func(ctx context.Context) error {
		// Another caller, on a transaction of its own: t's ctx carries none.
		other := t.Context()
		err := nowait.Do(other, "a", func(context.Context) error { return nil })
		require.ErrorIs(t, err, contend.ErrConflict)
		return l.Claim(other, 2, func(_ context.Context, _ contend.DBTX, claimed []string) error {
			require.Equal(t, []string{"b", "c"}, claimed, "the held row is skipped")
			return nil
		})
	})
	require.NoError(t, err)
	errRan := errors.New("ran")
	require.ErrorIs(t, l.Claim(ctx, 1, func(context.Context, contend.DBTX, []string) error { return errRan }), errRan)
}

// Two transactions lock rows a and b in opposite orders: MariaDB kills one
// as a deadlock (1213), which InTx, owning the transaction, runs again; both
// end applied.
func TestInTxRetriesADeadlockOnMariaDB(t *testing.T) {
	t.Parallel()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	mariaRows(t, h.DB, "pair", "a", "b")
	var (
		runs  sync.Map // first run of each caller: wait for the other's first lock
		ready sync.WaitGroup
		count atomic.Int32
	)
	ready.Add(2)
	errs := make(chan error, 2)
	for i, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		go func() {
			errs <- pessimistic.InTx(t.Context(), h, nil, func(ctx context.Context) error {
				count.Add(1)
				q := contend.Querier(ctx, h.DB)
				if _, err := q.ExecContext(ctx, "UPDATE pair SET n = n + 1 WHERE id = ?", order[0]); err != nil {
					return err
				}
				if _, again := runs.LoadOrStore(i, true); !again {
					ready.Done()
					ready.Wait()
				}
				_, err := q.ExecContext(ctx, "UPDATE pair SET n = n + 1 WHERE id = ?", order[1])
				return err
			})
		}()
	}
	for range 2 {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 3, count.Load(), "one of the two ran again")
	var n []int
	require.NoError(t, h.DB.Select(&n, "SELECT n FROM pair ORDER BY id"))
	require.Equal(t, []int{2, 2}, n, "each transaction applied once")
}

package pessimistic_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

func TestLockCommitsAndRollsBack(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			products(t, db, 2, "p")
			l := newLocker(t, db, pessimistic.LockerConfig{})
			ctx := t.Context()

			require.NoError(t, l.Do(ctx, "p", func(ctx context.Context) error {
				tx := contend.Querier(ctx, nil)
				require.Equal(t, tx, contend.Querier(ctx, db), "fn reaches the same transaction both ways")
				return sell(ctx, tx, "p")
			}))
			require.Equal(t, 1, stockOf(t, db, "p"))

			boom := errors.New("boom")
			err := l.Do(ctx, "p", func(ctx context.Context) error {
				tx := contend.Querier(ctx, nil)
				require.NoError(t, sell(ctx, tx, "p"))
				return boom
			})
			require.ErrorIs(t, err, boom)
			require.Equal(t, 1, stockOf(t, db, "p"), "fn's error rolls its writes back")
			requireFree(t, db, "p")
		})
	}
}

// The lock is held while fn runs: another transaction cannot take the row,
// and it is free again after.
func TestLockHoldsTheRowWhileFnRuns(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 1, "p")
	l := newLocker(t, db, pessimistic.LockerConfig{})
	other := newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait})
	require.NoError(t, l.Do(t.Context(), "p", func(ctx context.Context) error {
		// A fresh context: a call under fn's ctx would join its transaction.
		err := other.Do(t.Context(), "p", func(context.Context) error { return nil })
		require.ErrorIs(t, err, contend.ErrConflict)
		require.ErrorContains(t, err, `"p"`)
		require.ErrorContains(t, err, "NOWAIT")
		require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err), "the server's error stays reachable")
		return nil
	}))
	requireFree(t, db, "p")
}

func TestMissingRowIsNotFoundNotConflict(t *testing.T) {
	t.Parallel()
	for _, mode := range []pessimistic.OnHeld{pessimistic.Wait, pessimistic.NoWait, pessimistic.SkipLocked} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, "postgres")
			products(t, db, 1, "p")
			l := newLocker(t, db, pessimistic.LockerConfig{OnHeld: mode})
			ctx := t.Context()
			ran := false
			err := l.Do(ctx, "ghost", func(context.Context) error { ran = true; return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
			require.NotErrorIs(t, err, contend.ErrConflict)
			require.ErrorContains(t, err, `"ghost"`)
			require.False(t, ran)

			// Keys are values, never SQL.
			err = l.Do(ctx, "p' OR '1'='1", func(context.Context) error { ran = true; return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
			require.False(t, ran)
		})
	}
}

func TestLockManyLocksAllInOneOrder(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			products(t, db, 5, "a", "b", "c")
			l := newLocker(t, h, pessimistic.LockerConfig{})
			other := newLocker(t, h, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait})
			ctx := t.Context()

			err := l.LockMany(ctx, []string{"c", "a", "c", "b"}, func(ctx context.Context, tx contend.DBTX, locked []string) error {
				require.Equal(t, []string{"a", "b", "c"}, locked, "sorted, without duplicates")
				for _, k := range locked {
					require.ErrorIs(t, other.Do(t.Context(), k, func(context.Context) error { return nil }), contend.ErrConflict, k)
					require.NoError(t, workload.SellVia(ctx, testserver.Querier(ctx, h), k))
				}
				return nil
			})
			require.NoError(t, err)
			for _, k := range []string{"a", "b", "c"} {
				require.Equal(t, 4, stockOf(t, db, k))
				requireFree(t, db, k)
			}

			ran := false
			err = l.LockMany(ctx, []string{"a", "ghost", "b", "phantom"}, func(context.Context, contend.DBTX, []string) error {
				ran = true
				return nil
			})
			require.ErrorIs(t, err, contend.ErrNotFound)
			require.NotErrorIs(t, err, contend.ErrConflict)
			require.ErrorContains(t, err, `"ghost", "phantom"`, "the error names the missing keys")
			require.False(t, ran)
			requireFree(t, db, "a")
		})
	}
}

// SKIP LOCKED: a held row is a lost race for Lock, and left out by LockMany,
// which runs fn with the free rows.
func TestSkipLocked(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 1, "a", "b", "c")
	l := newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.SkipLocked})
	ctx := t.Context()
	holder, _ := hold(t, db, "b")

	err := l.Do(ctx, "b", func(context.Context) error { return nil })
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorContains(t, err, `"b"`)

	err = l.LockMany(ctx, []string{"a", "b", "c", "ghost"}, func(_ context.Context, _ contend.DBTX, locked []string) error {
		require.Equal(t, []string{"a", "c"}, locked)
		return nil
	})
	require.NoError(t, err)

	err = l.LockMany(ctx, []string{"b"}, func(context.Context, contend.DBTX, []string) error { return nil })
	require.ErrorIs(t, err, contend.ErrConflict, "nothing free, and the row exists")
	err = l.LockMany(ctx, []string{"ghost", "phantom"}, func(context.Context, contend.DBTX, []string) error { return nil })
	require.ErrorIs(t, err, contend.ErrNotFound)

	require.NoError(t, holder.Rollback())
	require.NoError(t, l.Do(ctx, "b", func(context.Context) error { return nil }))
}

// Claim hands concurrent workers disjoint rows, and a job whose worker fails
// goes back to the queue.
func TestClaim(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			_, err := db.Exec(`CREATE TABLE jobs (id text PRIMARY KEY, done boolean NOT NULL DEFAULT false);
				INSERT INTO jobs (id) VALUES ('j1'), ('j2'), ('j3'), ('j4'), ('j5')`)
			require.NoError(t, err)
			l := newLocker(t, h, pessimistic.LockerConfig{Table: "jobs", ClaimWhere: "NOT done"})
			ctx := t.Context()
			finish := func(ctx context.Context, _ contend.DBTX, claimed []string) error {
				for _, id := range claimed {
					if _, err := testserver.Querier(ctx, h).Exec(ctx, `UPDATE jobs SET done = true WHERE id = $1`, id); err != nil {
						return err
					}
				}
				return nil
			}

			err = l.Claim(ctx, 2, func(ctx context.Context, tx contend.DBTX, first []string) error {
				require.Equal(t, []string{"j1", "j2"}, first)
				// A second worker, in a transaction of its own, meanwhile.
				// Free rows are there beside the held ones: its claim takes
				// a statement's time, which a bound far above it tells from
				// a wait for the held rows, which would last until the test
				// ends (the first worker waits for it).
				other, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				err := l.Claim(other, 2, func(ctx context.Context, tx contend.DBTX, second []string) error {
					require.Equal(t, []string{"j3", "j4"}, second, "held rows are skipped, not waited for")
					return finish(ctx, tx, second)
				})
				require.NotErrorIs(t, err, context.DeadlineExceeded, "the second worker's claim waited for the rows the first holds, instead of skipping them")
				require.NoError(t, err)
				return finish(ctx, tx, first)
			})
			require.NoError(t, err)

			boom := errors.New("worker failed")
			err = l.Claim(ctx, 10, func(ctx context.Context, tx contend.DBTX, claimed []string) error {
				require.Equal(t, []string{"j5"}, claimed, "done jobs are not claimed again")
				require.NoError(t, finish(ctx, tx, claimed))
				return boom
			})
			require.ErrorIs(t, err, boom)
			require.NoError(t, l.Claim(ctx, 10, func(ctx context.Context, tx contend.DBTX, claimed []string) error {
				require.Equal(t, []string{"j5"}, claimed, "the failed job is back in the queue")
				return finish(ctx, tx, claimed)
			}))

			ran := false
			err = l.Claim(ctx, 1, func(context.Context, contend.DBTX, []string) error { ran = true; return nil })
			require.ErrorIs(t, err, contend.ErrNotFound, "nothing left to claim")
			require.False(t, ran)
		})
	}
}

// A locker on a caller's transaction neither begins nor commits: its writes
// and its lock belong to the caller's transaction.
func TestInsideACallersTransaction(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			products(t, db, 3, "p")
			ctx := t.Context()
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()

			l := newLocker(t, tx, pessimistic.LockerConfig{})
			require.NoError(t, l.Do(ctx, "p", func(ctx context.Context) error {
				q := contend.Querier(ctx, nil)
				// q is the caller's transaction, watched by the library: the
				// same server transaction.
				var mine, callers int64
				require.NoError(t, q.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&mine))
				require.NoError(t, tx.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&callers))
				require.Equal(t, callers, mine)
				return sell(ctx, q, "p")
			}))
			require.Equal(t, 3, stockOf(t, db, "p"), "not committed by the locker")
			err = newLocker(t, db, pessimistic.LockerConfig{OnHeld: pessimistic.NoWait}).Do(ctx, "p", func(context.Context) error { return nil })
			require.ErrorIs(t, err, contend.ErrConflict, "the lock is the caller's until it commits")

			require.NoError(t, tx.Commit())
			require.Equal(t, 2, stockOf(t, db, "p"))
			requireFree(t, db, "p")
		})
	}
}

// A call whose ctx carries a transaction joins it: nested locks share one
// transaction, and an error anywhere rolls back all of it.
func TestNestedCallsJoinTheTransaction(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 3, "a", "b")
	l := newLocker(t, db, pessimistic.LockerConfig{})
	adv, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{})
	require.NoError(t, err)
	ctx := t.Context()
	boom := errors.New("boom")
	err = l.Do(ctx, "a", func(ctx context.Context) error {
		outer := contend.Querier(ctx, nil)
		require.NoError(t, sell(ctx, outer, "a"))
		return l.Do(ctx, "b", func(ctx context.Context) error {
			inner := contend.Querier(ctx, nil)
			require.Equal(t, outer, inner)
			require.NoError(t, sell(ctx, inner, "b"))
			return adv.Do(ctx, testserver.RandomName("x:"), func(ctx context.Context) error {
				innermost := contend.Querier(ctx, nil)
				require.Equal(t, outer, innermost)
				return boom
			})
		})
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 3, stockOf(t, db, "a"))
	require.Equal(t, 3, stockOf(t, db, "b"))
	requireFree(t, db, "a")
	requireFree(t, db, "b")
}

// The default FOR NO KEY UPDATE lets other transactions insert rows that
// reference the locked one; FOR UPDATE makes them wait.
func TestStrength(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 3, "p")
	_, err := db.Exec(`CREATE TABLE order_lines (id serial PRIMARY KEY, product_id text NOT NULL REFERENCES products)`)
	require.NoError(t, err)
	ctx := t.Context()
	insertLine := func() error {
		tx, err := db.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		defer tx.Rollback()
		if _, err := tx.Exec(`SET LOCAL lock_timeout = 100`); err != nil {
			return err
		}
		_, err = tx.Exec(`INSERT INTO order_lines (product_id) VALUES ('p')`)
		return err
	}

	l := newLocker(t, db, pessimistic.LockerConfig{})
	require.NoError(t, l.Do(ctx, "p", func(context.Context) error {
		require.NoError(t, insertLine(), "FOR NO KEY UPDATE must not block a referencing insert")
		return nil
	}))
	l = newLocker(t, db, pessimistic.LockerConfig{Strength: pessimistic.ForUpdate})
	require.NoError(t, l.Do(ctx, "p", func(context.Context) error {
		err := insertLine()
		require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err), "FOR UPDATE blocks a referencing insert: %v", err)
		return nil
	}))
}

// Keys are sent as text; the server converts them to the key column's type.
func TestNonTextKeyColumn(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			_, err := db.Exec(`CREATE TABLE accounts (number bigint PRIMARY KEY, balance bigint NOT NULL);
				INSERT INTO accounts VALUES (1, 10), (2, 20)`)
			require.NoError(t, err)
			l := newLocker(t, h, pessimistic.LockerConfig{Table: "accounts", KeyColumn: "number"})
			ctx := t.Context()
			require.NoError(t, l.Do(ctx, "2", func(context.Context) error { return nil }))
			require.ErrorIs(t, l.Do(ctx, "3", func(context.Context) error { return nil }), contend.ErrNotFound)
			require.NoError(t, l.LockMany(ctx, []string{"2", "1"}, func(_ context.Context, _ contend.DBTX, locked []string) error {
				require.Equal(t, []string{"1", "2"}, locked)
				return nil
			}))
		})
	}
}

// With a lock timeout, a long wait is a lost race, not the caller's ctx
// ending; with a ctx that ends first, it is ctx's error.
func TestLockTimeout(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			products(t, db, 1, "p")
			hold(t, db, "p")

			l := newLocker(t, db, pessimistic.LockerConfig{LockTimeout: 100 * time.Millisecond})
			began := time.Now()
			err := l.Do(t.Context(), "p", func(context.Context) error { return errors.New("fn ran") })
			require.ErrorIs(t, err, contend.ErrConflict)
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			require.NotErrorIs(t, err, context.Canceled)
			require.ErrorContains(t, err, "lock timeout")
			require.GreaterOrEqual(t, time.Since(began), 100*time.Millisecond)

			l = newLocker(t, db, pessimistic.LockerConfig{LockTimeout: time.Minute})
			// Long enough that, on a loaded machine, ctx ends in the wait for
			// the row and not while the call still begins its transaction,
			// which is no lost race.
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			err = l.Do(ctx, "p", func(context.Context) error { return errors.New("fn ran") })
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorIs(t, err, contend.ErrConflict, "a wait ctx ended is a lost race too")
		})
	}
}

// The lock timeout covers the whole transaction the locker owns, but only
// the lock inside a caller's transaction, whose own setting is put back.
func TestLockTimeoutScope(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	products(t, db, 1, "p")
	ctx := t.Context()
	show := func(ctx context.Context, q contend.DBTX) string {
		var s string
		require.NoError(t, q.QueryRowContext(ctx, `SHOW lock_timeout`).Scan(&s))
		return s
	}
	cfg := pessimistic.LockerConfig{LockTimeout: 250 * time.Millisecond}
	require.NoError(t, newLocker(t, db, cfg).Do(ctx, "p", func(ctx context.Context) error {
		tx := contend.Querier(ctx, nil)
		require.Equal(t, "250ms", show(ctx, tx))
		return nil
	}))

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec(`SET LOCAL lock_timeout = '7s'`)
	require.NoError(t, err)
	require.NoError(t, newLocker(t, tx, cfg).Do(ctx, "p", func(ctx context.Context) error {
		tx := contend.Querier(ctx, nil)
		require.Equal(t, "7s", show(ctx, tx))
		return nil
	}))
	require.Equal(t, "7s", show(ctx, tx))
}

// A statement_timeout also ends a wait with 57014, like a client's cancel,
// but it is neither the caller's ctx nor a lost race: a backend error.
func TestStatementTimeoutIsABackendError(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 1, "p")
	hold(t, db, "p")
	tx, err := db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec(`SET LOCAL statement_timeout = 100`)
	require.NoError(t, err)
	err = newLocker(t, tx, pessimistic.LockerConfig{}).Do(t.Context(), "p", func(context.Context) error { return nil })
	require.Equal(t, sqlerr.QueryCanceled, sqlerr.Code(err), "%v", err)
	require.NotErrorIs(t, err, contend.ErrConflict)
	require.NotErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
}

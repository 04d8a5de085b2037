package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/waitfor"
	"github.com/contend/contend/optimistic"
)

// bigBudget is a retry budget no test run exhausts: losers back off and try
// again until they win.
var bigBudget = contend.Retry{MaxAttempts: 10_000, MaxDelay: 20 * time.Millisecond}

// guardSuite puts the guard's version on the conformance suite's counter rows,
// the rows fn's read-modify-write depends on.
func guardSuite(driver string) guardtest.Suite {
	return guardtest.Suite{
		Driver: driver,
		Setup: func(t testing.TB, env guardtest.Env, _ []string) {
			_, err := env.DB.Exec(`ALTER TABLE guardtest_counters ADD COLUMN version bigint NOT NULL DEFAULT 0`)
			require.NoError(t, err)
		},
		NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
			return optimistic.NewGuard(db, optimistic.Config{Table: "guardtest_counters", KeyColumn: "key", Retry: bigBudget})
		},
		// Neither exclusive nor fail-fast: fns overlap, only one per
		// version commits, and with this budget the losers never give up.
		FailFast:  false,
		Exclusive: false,
	}
}

// The whole Guard contract, as an optimistic guard promises it: no lost
// update from goroutines and from three processes (every fn overlaps others
// there, so most attempts lose: half the suite's operations keep it short;
// with the version check broken, the 288 calls across processes lose about
// 200 updates), a
// second caller runs while the first is inside and the first runs again, fn's
// error, ctx and panics. lib/pq and pgx native here; pgx's stdlib across processes in
// TestUpdateCounterUnderContention, and from goroutines below.
func TestGuardIsAGuard(t *testing.T) {
	for _, driver := range []string{"postgres", testserver.PgxNative} {
		t.Run(driver, func(t *testing.T) {
			s := guardSuite(driver)
			s.Ops = 6
			guardtest.Run(t, s)
		})
	}
}

func TestGuardNoLostUpdatePgx(t *testing.T) {
	s := guardSuite("pgx")
	rep := guardtest.Contend(t, s, harness.Config{Goroutines: 16, Ops: 24, Keys: []string{"a", "b", "c"}})
	rep.RequireHeld(t, s)
}

func guard(t testing.TB, db *sqlx.DB, cfg optimistic.Config) *optimistic.Guard {
	t.Helper()
	g, err := optimistic.NewGuard(db, cfg)
	require.NoError(t, err)
	return g
}

// withdraw is a fn that takes amount from account id through the guard's
// transaction.
func withdraw(db *sqlx.DB, id string, amount int64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var balance int64
		if err := q.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&balance); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, id, balance-amount)
		return err
	}
}

func TestGuardDo(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			accounts(t, db, "a")
			var obs observed
			g := guard(t, db, optimistic.Config{Table: "accounts", Observer: &obs})
			ctx := t.Context()

			require.NoError(t, g.Do(ctx, "a", withdraw(db, "a", 30)))
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 70, Version: 1}, rowOf(t, db, "a"))
			require.Equal(t, 1, obs.last())

			// fn's error is returned unchanged, and its writes roll back.
			sentinel := errors.New("fn failed")
			err := g.Do(ctx, "a", func(ctx context.Context) error {
				if err := withdraw(db, "a", 70)(ctx); err != nil {
					return err
				}
				return fmt.Errorf("wrapped: %w", sentinel)
			})
			require.ErrorIs(t, err, sentinel)
			err = g.Do(ctx, "a", func(context.Context) error { return sentinel })
			require.Equal(t, sentinel, err)
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 70, Version: 1}, rowOf(t, db, "a"))

			err = g.Do(ctx, "ghost", func(context.Context) error { t.Error("fn ran for a missing row"); return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
			require.NotErrorIs(t, err, contend.ErrConflict)
		})
	}
}

// raceBound bounds an attempt of TestGuardLostRace's callers: a few
// statements on a local server, which a loaded runner under the race
// detector may make take a second or two, but never ten.
const raceBound = 10 * time.Second

// A second Do on a key whose first Do is inside fn does not wait: its fn runs
// and commits. The first one's version check then fails, its writes roll
// back, and it runs fn again on the new state; with no attempt to spare it
// gives up with ErrConflict naming the key.
func TestGuardLostRace(t *testing.T) {
	t.Parallel()
	for _, budget := range []int{1, 2} {
		t.Run(fmt.Sprintf("attempts=%d", budget), func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, "pgx")
			accounts(t, db, "a")
			var obs observed
			g := guard(t, db, optimistic.Config{Table: "accounts", Retry: contend.Retry{MaxAttempts: budget}, Observer: &obs})
			ctx := t.Context()

			inside, leave := make(chan struct{}), make(chan struct{})
			var once sync.Once
			runs := 0
			holderErr := make(chan error, 1)
			go func() {
				holderErr <- g.Do(ctx, "a", func(ctx context.Context) error {
					runs++
					q := contend.Querier(ctx, db)
					var balance int64
					if err := q.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 'a'`).Scan(&balance); err != nil {
						return err
					}
					// Decided; the other caller gets in before the write. The
					// wait ends with the test too, so that a test that failed
					// before leave does not leave this transaction open, and
					// the cleanup's DROP waiting for it.
					once.Do(func() {
						close(inside)
						select {
						case <-leave:
						case <-ctx.Done():
						}
					})
					_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = $1 WHERE id = 'a'`, balance-10)
					return err
				})
			}()
			select {
			case <-inside:
			case err := <-holderErr:
				t.Fatalf("holder did not get in: %v", err)
			}

			// The second caller's call is a read, a write and the version
			// check, with nothing to wait for: the first caller holds no
			// lock. A bound ends the test if it waits anyway, for the first
			// caller, which waits for the test.
			ran := false
			err := waitfor.Call(t, raceBound, "lost_race: the second caller never returned: the optimistic guard made it wait for the first, and ignored ctx",
				func(ctx context.Context) error {
					return g.Do(ctx, "a", func(ctx context.Context) error {
						ran = true
						return withdraw(db, "a", 10)(ctx)
					})
				})
			require.NotErrorIs(t, err, context.DeadlineExceeded,
				"lost_race: the second caller never returned: the optimistic guard made it wait for the first")
			require.NoError(t, err, "an optimistic guard does not keep a second caller out")
			require.True(t, ran)
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 90, Version: 1}, rowOf(t, db, "a"))

			close(leave)
			err = waitfor.Recv(t, holderErr, time.Duration(budget)*raceBound,
				"lost_race: the first caller never returned after the second committed: its version check waits, or it retries without end")
			if budget == 1 {
				require.ErrorIs(t, err, contend.ErrConflict)
				require.ErrorContains(t, err, `"a"`, "the conflict names its key")
				require.Equal(t, 1, runs)
				require.Equal(t, account{ID: "a", Owner: "ann", Balance: 90, Version: 1}, rowOf(t, db, "a"),
					"the loser's write, based on balance 100, rolled back")
			} else {
				require.NoError(t, err)
				require.Equal(t, 2, runs, "the loser ran fn again")
				require.Equal(t, 2, obs.last())
				require.Equal(t, account{ID: "a", Owner: "ann", Balance: 80, Version: 2}, rowOf(t, db, "a"),
					"both withdrawals count")
			}
		})
	}
}

func TestGuardFaults(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	accounts(t, db, "a")
	g := guard(t, db, optimistic.Config{Table: "accounts", Retry: bigBudget})
	untouched := account{ID: "a", Owner: "ann", Balance: 100}

	t.Run("ctx_cancelled_before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ran := false
		err := g.Do(ctx, "a", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, ran, "fn ran under a cancelled ctx")
	})
	t.Run("ctx_cancelled_during_fn", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		err := g.Do(ctx, "a", func(ctx context.Context) error {
			if err := withdraw(db, "a", 50)(ctx); err != nil {
				return err
			}
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, untouched, rowOf(t, db, "a"))
	})
	t.Run("ctx_cancelled_after_fn", func(t *testing.T) {
		// fn succeeds but the caller gives up before the version check:
		// nothing commits.
		ctx, cancel := context.WithCancel(t.Context())
		err := g.Do(ctx, "a", func(ctx context.Context) error {
			err := withdraw(db, "a", 50)(ctx)
			cancel()
			return err
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, untouched, rowOf(t, db, "a"))
	})
	t.Run("panic_in_fn", func(t *testing.T) {
		require.PanicsWithValue(t, "boom", func() {
			_ = g.Do(t.Context(), "a", func(ctx context.Context) error {
				if err := withdraw(db, "a", 50)(ctx); err != nil {
					return err
				}
				panic("boom")
			})
		})
		require.Equal(t, untouched, rowOf(t, db, "a"), "the panic rolled fn's write back")
	})
	t.Run("ctx_cancelled_during_retries", func(t *testing.T) {
		slow := guard(t, db, optimistic.Config{Table: "accounts", Retry: contend.Retry{MaxAttempts: 1000, BaseDelay: time.Hour, MaxDelay: time.Hour}})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		firstRun := make(chan struct{})
		errc := make(chan error, 1)
		var once sync.Once
		go func() {
			errc <- slow.Do(ctx, "a", func(ctx context.Context) error {
				defer once.Do(func() { close(firstRun) })
				// Another writer moves the version under every attempt.
				_, err := db.ExecContext(ctx, `UPDATE accounts SET version = version + 1 WHERE id = 'a'`)
				return err
			})
		}()
		select {
		case <-firstRun:
		case err := <-errc:
			t.Fatalf("Do ended before its first attempt: %v", err)
		}
		cancel()
		cancelled := time.Now()
		select {
		case err := <-errc:
			require.ErrorIs(t, err, context.Canceled)
			require.Less(t, time.Since(cancelled), 2*time.Second)
		case <-time.After(10 * time.Second):
			t.Fatal("Do did not return after ctx was cancelled")
		}
	})
	t.Run("still_free", func(t *testing.T) {
		ran := false
		require.NoError(t, g.Do(t.Context(), "a", func(context.Context) error { ran = true; return nil }))
		require.True(t, ran)
	})
	t.Run("bad_input", func(t *testing.T) {
		ran := false
		err := g.Do(t.Context(), "", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, contend.ErrInvalid)
		require.False(t, ran)
		require.ErrorIs(t, g.Do(t.Context(), "a", nil), contend.ErrInvalid)
	})
}

// On a caller's transaction the guard runs fn once inside it and neither
// commits nor retries: a lost race is returned for the owner to handle.
func TestGuardInsideACallersTransaction(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	ctx := t.Context()

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	g := guard(t, db, accountsConfig)
	onTx, err := optimistic.NewGuard(tx, accountsConfig)
	require.NoError(t, err)
	runs := 0
	err = onTx.Do(ctx, "a", func(ctx context.Context) error {
		runs++
		// fn gets the caller's transaction, watched by the library: the same
		// server transaction.
		var mine, callers int64
		require.NoError(t, contend.Querier(ctx, db).QueryRowContext(ctx, `SELECT txid_current()`).Scan(&mine))
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&callers))
		require.Equal(t, callers, mine, "fn gets the caller's transaction")
		return withdraw(db, "a", 10)(ctx)
	})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.EqualValues(t, 100, rowOf(t, db, "a").Balance, "the owner rolled back")

	tx, err = db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	onTx, err = optimistic.NewGuard(tx, optimistic.Config{Table: "accounts", Retry: bigBudget})
	require.NoError(t, err)
	runs = 0
	err = onTx.Do(ctx, "a", func(ctx context.Context) error {
		runs++
		// Another caller commits a change to "a" while this one decides.
		if err := g.Do(contend.WithQuerier(ctx, db), "a", withdraw(db, "a", 1)); err != nil {
			return err
		}
		return withdraw(db, "a", 10)(ctx)
	})
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, 1, runs, "no retry inside a caller's transaction, whatever the budget")
	require.NoError(t, tx.Rollback())
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 99, Version: 1}, rowOf(t, db, "a"))
}

package atomic_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	gatomic "sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
)

// hotKeyDrivers are the drivers the hot key's tests run on: PostgreSQL's
// database/sql drivers (the path is the same through pgx's native pool) and
// MariaDB, whose hot keys share a read rather than the claim.
var hotKeyDrivers = append(append([]string{}, testserver.Drivers...), testserver.MariaDBDriver)

// hotKeySetup opens driver's server, makes a bots row for each of ids
// and returns the handle a claimer is given, the pool under it and the
// database's url.
func hotKeySetup(t *testing.T, driver string, ids ...string) (contend.DB, *sqlx.DB, string) {
	t.Helper()
	url := testserver.URL(t, driver)
	h := testserver.Handle(t, driver, url)
	if driver == testserver.MariaDBDriver {
		db := h.(testserver.MariaDBHandle).DB
		mariaBots(t, db, ids...)
		return h, db, url
	}
	db := h.(*sqlx.DB)
	bots(t, db, ids...)
	return h, db, url
}

// blockWrites begins a transaction under which a write of key's row waits
// and a plain read of it does not, and returns it with a func that reports
// how many sessions wait for it. On PostgreSQL it locks the table in SHARE
// mode (an UPDATE whose condition fails takes no row lock there); on
// MariaDB it locks the row (an UPDATE locks each row it reads). The caller
// rolls it back.
func blockWrites(t *testing.T, ctx context.Context, driver string, db *sqlx.DB, key string) (*sqlx.Tx, func() int) {
	t.Helper()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var self int64
	selfID := "SELECT pg_backend_pid()"
	waiting := "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))"
	if driver == testserver.MariaDBDriver {
		selfID = "SELECT CONNECTION_ID()"
		// The only UPDATE of the test's own database running a while waits
		// for the lock (INNODB_TRX leaves transactions out on a busy server).
		waiting = `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE ? > 0 AND DB = DATABASE() AND INFO LIKE 'UPDATE%' AND STATE = 'Updating' AND TIME_MS > 100`
	}
	require.NoError(t, tx.QueryRowContext(ctx, selfID).Scan(&self))
	if driver == testserver.MariaDBDriver {
		var one int
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT 1 FROM bots WHERE id = ? FOR UPDATE", key).Scan(&one))
	} else {
		_, err := tx.ExecContext(ctx, "LOCK TABLE bots IN SHARE MODE")
		require.NoError(t, err)
	}
	return tx, func() int {
		var n int
		if err := db.QueryRowContext(ctx, db.Rebind(waiting), self).Scan(&n); err != nil {
			return 0
		}
		return n
	}
}

// setOwner writes key's owner column by hand (nil: free).
func setOwner(t *testing.T, db *sqlx.DB, key string, owner *string) {
	t.Helper()
	_, err := db.Exec(db.Rebind("UPDATE bots SET engine_id = ? WHERE id = ?"), owner, key)
	require.NoError(t, err)
}

// The claims of a key that keep losing share one statement: under a
// transaction that makes writes of the row wait (blockWrites), eight claims
// of the hot key at once, held by another, send one claim on PostgreSQL,
// the one session that waits, and all lose when the transaction ends; on
// MariaDB they share a read, which answers ErrConflict without waiting. A
// missing row is still ErrNotFound, and a free key is claimed. A key whose
// claims win, among many, is claimed directly: its claim waits.
func TestClaimerSharesAHotKeysStatement(t *testing.T) {
	t.Parallel()
	for _, driver := range hotKeyDrivers {
		for name, cfg := range map[string]atomic.ClaimerConfig{"plain": plain, "leased": longLeased} {
			t.Run(driver+"/"+name, func(t *testing.T) {
				t.Parallel()
				sharesAHotKeysStatement(t, driver, cfg)
			})
		}
	}
}

func sharesAHotKeysStatement(t *testing.T, driver string, cfg atomic.ClaimerConfig) {
	spread := make([]string, 50)
	for i := range spread {
		spread[i] = "k" + strconv.Itoa(i)
	}
	h, db, _ := hotKeySetup(t, driver, append([]string{"hot", "gone"}, spread...)...)
	c := claimer(t, h, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	other := "other-instance"

	// Spread keys: 8 goroutines claim and release at random. Some
	// claims lose, few on any one key.
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 40 {
				key := spread[rand.IntN(len(spread))]
				tok, err := c.Claim(ctx, key)
				if errors.Is(err, contend.ErrConflict) {
					continue
				}
				if err == nil {
					_, err = c.Release(ctx, key, tok)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// The hot key (and the one about to go) lose every claim: held
	// by another instance.
	setOwner(t, db, "hot", &other)
	setOwner(t, db, "gone", &other)
	for range 64 {
		for _, key := range []string{"hot", "gone"} {
			require.ErrorIs(t, c.ClaimAs(ctx, key, "mine"), contend.ErrConflict)
		}
	}

	t.Run("hot key held: one statement for the claims at once", func(t *testing.T) {
		tx, waiting := blockWrites(t, ctx, driver, db, "hot")
		claimCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if driver == testserver.MariaDBDriver {
			began := time.Now()
			err := c.ClaimAs(claimCtx, "hot", "mine")
			require.ErrorIs(t, err, contend.ErrConflict, "after %v", time.Since(began))
			require.NoError(t, tx.Rollback())
			return
		}
		const claims = 8
		errs := make(chan error, claims)
		for i := range claims {
			go func() { errs <- c.ClaimAs(claimCtx, "hot", "mine-"+strconv.Itoa(i)) }()
		}
		require.Eventually(t, func() bool { return atomic.HotCallers(c, "hot") == claims && waiting() > 0 },
			10*time.Second, time.Millisecond, "the claims did not come, or none waited for the lock")
		assert.Never(t, func() bool { return waiting() > 1 }, 300*time.Millisecond, 10*time.Millisecond, "more than one of the claims was sent")
		require.NoError(t, tx.Rollback())
		for range claims {
			require.ErrorIs(t, <-errs, contend.ErrConflict)
		}
	})
	t.Run("hot key gone: ErrNotFound", func(t *testing.T) {
		_, err := db.Exec(db.Rebind("DELETE FROM bots WHERE id = ?"), "gone")
		require.NoError(t, err)
		require.ErrorIs(t, c.ClaimAs(ctx, "gone", "mine"), contend.ErrNotFound)
	})
	if cfg.LeaseColumn != "" {
		t.Run("hot key whose lease passed: taken over", func(t *testing.T) {
			passed := "UPDATE bots SET lease_until = now() - interval '1 hour' WHERE id = 'hot'"
			if driver == testserver.MariaDBDriver {
				passed = "UPDATE bots SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE id = 'hot'"
			}
			_, err := db.Exec(passed)
			require.NoError(t, err)
			require.NoError(t, c.ClaimAs(ctx, "hot", "mine"))
			released, err := c.Release(ctx, "hot", "mine")
			require.NoError(t, err)
			require.True(t, released)
			setOwner(t, db, "hot", &other)
		})
	}
	t.Run("hot key free: claimed", func(t *testing.T) {
		setOwner(t, db, "hot", nil)
		require.NoError(t, c.ClaimAs(ctx, "hot", "mine"))
		released, err := c.Release(ctx, "hot", "mine")
		require.NoError(t, err)
		require.True(t, released)
	})
	t.Run("spread key held: the claim's UPDATE waits", func(t *testing.T) {
		// A spread key that lost a claim or two may have turned hot: the
		// first that has not.
		i := slices.IndexFunc(spread, func(k string) bool { return !atomic.KeyHot(c, k) })
		require.NotEqual(t, -1, i, "every spread key turned hot")
		key := spread[i]
		setOwner(t, db, key, &other)
		tx, waiting := blockWrites(t, ctx, driver, db, key)
		claimed := make(chan error, 1)
		go func() { claimed <- c.ClaimAs(ctx, key, "mine") }()
		if !assert.Eventually(t, func() bool { return waiting() > 0 }, 15*time.Second, 10*time.Millisecond, "the claim of a spread key did not wait: it did not write") {
			_ = tx.Rollback()
			<-claimed
			t.FailNow()
		}
		require.NoError(t, tx.Rollback())
		require.ErrorIs(t, <-claimed, contend.ErrConflict)
	})
}

// Two instances (claimers on pools of their own), 16 goroutines each, claim
// and release one key, which turns hot in both, on PostgreSQL and MariaDB: a claim is never made while
// another holds it (each winner finds the process's record of the owner
// empty, and leaves it empty), every claim made is released by its token,
// and the row is never taken for missing. The negative control, a read
// first followed by an UPDATE that does not check the owner again, lets two
// callers hold the key at once, which the same checks see.
//
// It runs before the package's parallel tests, not beside them: its 32
// goroutines claim without a pause for a second, and with the hot key's
// statements shared their lost races come back fast enough to keep both cores
// busy, which would make the timers of the fault tests late.
func TestHotKeyUnderContention(t *testing.T) {
	for _, driver := range []string{"pgx", testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			t.Run("claimer", func(t *testing.T) {
				h, db, url := hotKeySetup(t, driver, "hot")
				second := testserver.Handle(t, driver, url)
				instances := []*atomic.Claimer{claimer(t, h, plain), claimer(t, second, plain)}
				claims := func(i int) claimOp {
					c := instances[i%2]
					return claimOp{
						claim:   func(ctx context.Context, tok string) error { return c.ClaimAs(ctx, "hot", tok) },
						release: func(ctx context.Context, tok string) (bool, error) { return c.Release(ctx, "hot", tok) },
					}
				}
				r := contendFor(t, claims)
				shared := atomic.HotSent(instances[0]) + atomic.HotSent(instances[1])
				t.Logf("%+v, %d shared statements", r, shared)
				require.Zero(t, r.twoOwners, "a claim was made while another held the key")
				require.Zero(t, r.lost, "a claim made was gone at its release")
				require.Zero(t, r.notFound, "the key's row was taken for missing")
				require.Positive(t, r.wins)
				require.Greater(t, r.conflicts, r.wins, "the key was not hot")
				require.Positive(t, shared, "the key's claims never shared a statement")
				for _, c := range instances {
					require.Zero(t, atomic.HotCallers(c, "hot"), "a shared statement outlived its claims")
				}
				if driver != testserver.MariaDBDriver {
					return // below, the read of MariaDB's hot keys
				}

				// Both instances read the key first now: held and locked,
				// each answers ErrConflict without waiting for the lock.
				other := "other-instance"
				setOwner(t, db, "hot", &other)
				tx, _ := blockWrites(t, t.Context(), driver, db, "hot")
				for _, c := range instances {
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					require.ErrorIs(t, c.ClaimAs(ctx, "hot", "mine"), contend.ErrConflict)
					cancel()
				}
				require.NoError(t, tx.Rollback())
			})
			t.Run("naive_control", func(t *testing.T) {
				_, db, _ := hotKeySetup(t, driver, "hot")
				read, write := db.Rebind("SELECT engine_id FROM bots WHERE id = ?"), db.Rebind("UPDATE bots SET engine_id = ? WHERE id = ?")
				release := db.Rebind("UPDATE bots SET engine_id = NULL WHERE id = ? AND engine_id = ?")
				naive := claimOp{
					claim: func(ctx context.Context, tok string) error {
						var owner *string
						if err := db.GetContext(ctx, &owner, read, "hot"); err != nil {
							return err
						}
						if owner != nil {
							return contend.ErrConflict
						}
						_, err := db.ExecContext(ctx, write, tok, "hot")
						return err
					},
					release: func(ctx context.Context, tok string) (bool, error) {
						res, err := db.ExecContext(ctx, release, "hot", tok)
						if err != nil {
							return false, err
						}
						n, err := res.RowsAffected()
						return n == 1, err
					},
				}
				r := contendFor(t, func(int) claimOp { return naive })
				t.Logf("%+v", r)
				require.Positive(t, r.twoOwners+r.lost, "the naive claim never let two callers hold the key: the test cannot see it")
			})
		})
	}
}

// A claimOp claims and releases the contended key with a token.
type claimOp struct {
	claim   func(ctx context.Context, token string) error
	release func(ctx context.Context, token string) (bool, error)
}

// contention is what contendFor saw.
type contention struct {
	wins, conflicts, notFound int64
	twoOwners                 int64 // claims made while the process's record had another owner
	lost                      int64 // claims made whose release found them gone
}

// contendFor runs 32 goroutines, goroutine i with op(i), each claiming
// and releasing for about a second, and fails t with any error but a lost
// race or a missing row, which it counts.
func contendFor(t *testing.T, op func(i int) claimOp) contention {
	t.Helper()
	var (
		r     contention
		owner gatomic.Pointer[string] // the holder, as this process knows it
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	until := time.Now().Add(time.Second)
	errs := make(chan error, 32)
	for i := range 32 {
		o := op(i)
		wg.Go(func() {
			for n := 0; time.Now().Before(until); n++ {
				tok := fmt.Sprintf("g%d-%d", i, n)
				err := o.claim(ctx, tok)
				switch {
				case errors.Is(err, contend.ErrConflict):
					gatomic.AddInt64(&r.conflicts, 1)
					continue
				case errors.Is(err, contend.ErrNotFound):
					gatomic.AddInt64(&r.notFound, 1)
					continue
				case err != nil:
					errs <- err
					return
				}
				gatomic.AddInt64(&r.wins, 1)
				if !owner.CompareAndSwap(nil, &tok) {
					gatomic.AddInt64(&r.twoOwners, 1)
				}
				// The holder's work: long enough for others to try.
				time.Sleep(time.Millisecond)
				owner.CompareAndSwap(&tok, nil)
				released, err := o.release(ctx, tok)
				if err != nil {
					errs <- err
					return
				}
				if !released {
					gatomic.AddInt64(&r.lost, 1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return r
}

package atomic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
)

// every driver the claimer runs on, with the helpers that make its table.
func claimerDrivers() []string { return append(testserver.AllDrivers, testserver.MariaDBDriver) }

func makeBotsFor(driver string) func(testing.TB, *sqlx.DB, ...string) {
	if driver == testserver.MariaDBDriver {
		return mariaBots
	}
	return bots
}

// NewClaimer does no I/O: on a server gone silent it returns at once, and
// the claimer's first call is what meets the silence, and returns by its
// own ctx's deadline. Several first calls at once each return by their own
// deadline, not one after another; one whose ctx has no deadline returns
// once it is cancelled. The failed preparation is not remembered: once the
// network is back, the next call prepares and claims.
func TestClaimerPreparesAtFirstUseUnderItsCtx(t *testing.T) {
	t.Parallel()
	for _, driver := range claimerDrivers() {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.URL(t, driver)
			makeBotsFor(driver)(t, testserver.Open(t, driver, url), "bot")
			proxy, proxied := txntest.Proxied(t, url)
			h := testserver.Handle(t, driver, proxied)
			proxy.Blackhole()

			made := make(chan *atomic.Claimer, 1)
			go func() {
				c, err := atomic.NewClaimer(h, plain)
				if err != nil {
					t.Error(err)
				}
				made <- c
			}()
			var c *atomic.Claimer
			select {
			case c = <-made:
			case <-time.After(2 * time.Second):
				t.Fatal("NewClaimer waited for the silent server")
			}
			require.NotNil(t, c)

			long, cancelLong := context.WithCancel(t.Context())
			longErr := make(chan error, 1)
			go func() {
				_, err := c.Claim(long, "bot")
				longErr <- err
			}()
			const calls, deadline = 3, time.Second
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			defer cancel()
			began := time.Now()
			errs := make(chan error, calls)
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					_, err := c.Claim(ctx, "bot")
					errs <- err
				})
			}
			wg.Wait()
			took := time.Since(began)
			close(errs)
			for err := range errs {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.NotErrorIs(t, err, contend.ErrConflict)
			}
			// A statement ctx cut short is waited for 250ms (txn.CancelGrace).
			require.Less(t, took, deadline+time.Second, "every first call returned by its deadline")
			cancelLong()
			select {
			case err := <-longErr:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(2 * time.Second):
				t.Fatal("the first call without a deadline outlived its cancelled ctx")
			}

			proxy.Heal()
			proxy.Reset() // the connections the blackhole left out of step
			tok, err := c.Claim(t.Context(), "bot")
			require.NoError(t, err, "a failed preparation is made again")
			released, err := c.Release(t.Context(), "bot", tok)
			require.NoError(t, err)
			require.True(t, released)
			require.NoError(t, c.Close(t.Context()))
		})
	}
}

// The statements are prepared once, at the first call, not per call: the
// one session of a one-connection pool counts five preparations (the
// claim, the two reads of a missing row that back it, outside a transaction
// and in one, the read of a key whose claims keep losing, and the release)
// however many claims it makes.
func TestClaimerPreparesOnce(t *testing.T) {
	t.Parallel()
	db, h := mariaSetup(t)
	mariaBots(t, db, "bot")
	db.SetMaxOpenConns(1) // one session, whose status counts its statements
	ctx := t.Context()
	prepared := func() int {
		t.Helper()
		var name string
		var n int
		require.NoError(t, db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n))
		return n
	}
	c := claimer(t, h, plain)
	before := prepared()
	for range 3 {
		require.NoError(t, c.Do(ctx, "bot", func(context.Context) error { return nil }))
	}
	require.Equal(t, 5, prepared()-before, "statements prepared")
}

// Close waits for a release that the claimer runs in the background (of a
// claim whose outcome is unknown) as long as its ctx lets it, and says so when
// cut short; a later Close, once that release is over, closes the claimer.
// Calls after Close are refused with ErrClosed; Close before any call, and
// Close again, are no-ops.
func TestClaimerCloseWaitsWithinCtx(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"postgres", testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			const key = "k-close-waits"
			url := testserver.URL(t, driver)
			makeBotsFor(driver)(t, testserver.Open(t, driver, url), key)
			proxy, proxied := txntest.Proxied(t, url)
			h := testserver.Handle(t, driver, proxied)

			unused, err := atomic.NewClaimer(h, plain)
			require.NoError(t, err)
			require.NoError(t, unused.Close(t.Context()), "Close before any call")
			require.NoError(t, unused.Close(t.Context()), "Close again")

			cfg := plain
			cfg.FinishTimeout = 3 * time.Second
			c, err := atomic.NewClaimer(h, cfg)
			require.NoError(t, err)
			// Prepared before the fault, so that the claim is what loses
			// its answer.
			_, err = c.Claim(t.Context(), "no such bot")
			require.ErrorIs(t, err, contend.ErrNotFound)

			// A claim sent into silence may have been made: the claimer
			// releases it in the background, and the release meets the
			// silence too.
			proxy.Blackhole()
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_, err = c.Claim(ctx, key)
			require.ErrorIs(t, err, context.DeadlineExceeded)

			short, cancelShort := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancelShort()
			began := time.Now()
			err = c.Close(short)
			require.ErrorIs(t, err, context.DeadlineExceeded, "cut short while the release runs")
			require.Less(t, time.Since(began), 2*time.Second)

			_, err = c.Claim(t.Context(), key)
			require.ErrorIs(t, err, contend.ErrClosed)
			require.ErrorIs(t, c.Do(t.Context(), key, func(context.Context) error {
				t.Error("fn ran after Close")
				return nil
			}), contend.ErrClosed)
			_, err = c.Release(t.Context(), key, "t")
			require.ErrorIs(t, err, contend.ErrClosed)

			// Once the network is back, and the connections left silent
			// are broken (the claim's, which lib/pq still waits on, keeps
			// its statement open until then), Close finishes.
			proxy.Heal()
			proxy.Reset()
			wait, cancelWait := context.WithTimeout(t.Context(), cfg.FinishTimeout+2*time.Second)
			defer cancelWait()
			require.NoError(t, c.Close(wait))
		})
	}
}

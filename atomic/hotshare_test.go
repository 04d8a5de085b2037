package atomic_test

import (
	"context"
	"errors"
	neturl "net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/testserver"
)

// proxiedSetup is hotKeySetup with the claimer's handle behind a fault
// proxy of its own, whose connections to PostgreSQL carry appName: it
// returns the handle, the proxy, and a pool of the test's own, direct.
func proxiedSetup(t *testing.T, driver, appName string, ids ...string) (contend.DB, *faultproxy.Proxy, *sqlx.DB) {
	t.Helper()
	url := testserver.URL(t, driver)
	direct := testserver.Open(t, driver, url)
	if driver == testserver.MariaDBDriver {
		mariaBots(t, direct, ids...)
	} else {
		bots(t, direct, ids...)
	}
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	if driver != testserver.MariaDBDriver {
		q := u.Query()
		q.Set("application_name", appName)
		u.RawQuery = q.Encode()
	}
	return testserver.Handle(t, driver, u.String()), proxy, direct
}

// makeHot makes c's claims of key lose until the key is hot, with key held
// by another instance; the key stays held.
func makeHot(t *testing.T, ctx context.Context, c *atomic.Claimer, db *sqlx.DB, key string) {
	t.Helper()
	other := "other-instance"
	setOwner(t, db, key, &other)
	for range 64 {
		require.ErrorIs(t, c.ClaimAs(ctx, key, "mine"), contend.ErrConflict)
	}
}

// Many callers of one Claimer claiming a held hot key at once all lose,
// and share the statements that tell them so: far fewer are sent than
// claims made. The link to the server is slow, so that the callers come
// while a statement is in flight, as they do on a busy server.
func TestHotKeyClaimsShareTheirStatement(t *testing.T) {
	t.Parallel()
	for _, driver := range claimerDrivers() {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			h, proxy, db := proxiedSetup(t, driver, "share-"+strconv.Itoa(int(time.Now().UnixNano())), "hot")
			c := claimer(t, h, plain)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			makeHot(t, ctx, c, db, "hot")

			proxy.SetLatency(20 * time.Millisecond)
			before := atomic.HotSent(c)
			const callers, each = 64, 4
			begin := make(chan struct{})
			errs := make(chan error, callers*each)
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					<-begin
					for range each {
						errs <- c.ClaimAs(ctx, "hot", "mine")
					}
				})
			}
			close(begin)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.ErrorIs(t, err, contend.ErrConflict)
			}
			sent := atomic.HotSent(c) - before
			t.Logf("%d claims, %d statements", callers*each, sent)
			require.Positive(t, sent)
			require.LessOrEqual(t, sent, int64(callers*each/8), "the claims did not share their statements")
			require.Zero(t, atomic.HotCallers(c, "hot"))
		})
	}
}

// A claim never takes the answer of a statement that began before it did.
// The claim of a held hot key has run on the server and its answer is on
// its way back over a slow link; the key is then freed, and a second claim
// comes: it must not take the first claim's "held" (the key was free all
// through its call), so it waits for that claim to end, sends its own, and
// claims the key. The first claim loses: the key was held as it ran.
// Sharing whichever statement is in flight would give the second claim a
// conflict here.
func TestHotKeyClaimTakesNoAnswerOlderThanItself(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			const latency = 750 * time.Millisecond
			appName := "stale-" + strconv.Itoa(int(time.Now().UnixNano()))
			h, proxy, db := proxiedSetup(t, driver, appName, "hot")
			c := claimer(t, h, plain)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			makeHot(t, ctx, c, db, "hot")

			var began time.Time
			require.NoError(t, db.Get(&began, "SELECT clock_timestamp()"))
			proxy.SetLatency(latency)
			first := make(chan error, 1)
			go func() { first <- c.ClaimAs(ctx, "hot", "first") }()
			// The claim has run on the server once its session is idle again,
			// after a statement that began after this test's clock read.
			ran := func() bool {
				var ok bool
				err := db.Get(&ok, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = $1
					AND state = 'idle' AND query LIKE 'WITH claimed AS%' AND query_start > $2)`, appName, began)
				return err == nil && ok
			}
			require.Eventually(t, ran, 30*time.Second, 5*time.Millisecond, "the first claim never ran")
			setOwner(t, db, "hot", nil)

			second := make(chan error, 1)
			go func() { second <- c.ClaimAs(ctx, "hot", "second") }()
			require.Eventually(t, func() bool { return atomic.HotCallers(c, "hot") == 2 }, 30*time.Second, time.Millisecond,
				"the second claim did not come while the first was in flight")
			require.ErrorIs(t, <-first, contend.ErrConflict, "the key was held as the first claim ran")
			err := <-second
			require.False(t, errors.Is(err, contend.ErrConflict),
				"a claim that came after the key was freed took the answer of a claim that began before it: %v", err)
			require.NoError(t, err)
			released, err := c.Release(ctx, "hot", "second")
			require.NoError(t, err)
			require.True(t, released)
		})
	}
}

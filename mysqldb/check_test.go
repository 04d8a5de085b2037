package mysqldb_test

import (
	"context"
	"database/sql"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/mysqldb"
)

// proxied returns a fault proxy in front of url's server and a pool of
// clientFoundRows through it.
func proxied(t *testing.T, url string) (*faultproxy.Proxy, *sql.DB) {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	p := faultproxy.Start(t, u.Host)
	u.Host = p.Addr()
	return p, open(t, u.String(), true)
}

// The check of clientFoundRows runs under the ctx of the call that needs
// it: on a silent network, each of several calls returns by its own
// deadline, not one after another by a fixed bound each. A check that
// failed so is made again once the network is back.
func TestCheckHonoursCtxAndIsNotRememberedFailed(t *testing.T) {
	t.Parallel()
	url := setup(t)
	proxy, db := proxied(t, url)
	h := mysqldb.Wrap(db)
	proxy.Blackhole()

	// A call whose ctx has no deadline, and three that have a short one.
	long, cancelLong := context.WithCancel(t.Context())
	longErr := make(chan error, 1)
	go func() {
		_, err := atomic.Update(long, h, sameStock, "p")
		longErr <- err
	}()
	const calls, deadline = 3, 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	began := time.Now()
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			_, err := atomic.Update(ctx, h, sameStock, "p")
			errs <- err
		})
	}
	wg.Wait()
	took := time.Since(began)
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	require.Less(t, took, deadline+500*time.Millisecond, "every call returned by its deadline")
	cancelLong()
	require.ErrorIs(t, <-longErr, context.Canceled)

	proxy.Heal()
	proxy.Reset() // the connections the blackhole left out of step
	applied, err := atomic.Update(t.Context(), h, sameStock, "p")
	require.NoError(t, err, "a failed check is made again")
	require.True(t, applied)
}

// A pool wrapped many times is checked once: the check's temporary table is
// created once in the pool's one session.
func TestCheckRunsOncePerPool(t *testing.T) {
	t.Parallel()
	url := setup(t)
	db := open(t, url, true)
	db.SetMaxOpenConns(1) // one session, whose status counts its statements
	ctx := t.Context()
	created := func() int {
		t.Helper()
		var name string
		var n int
		require.NoError(t, db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_create_temporary_table'").Scan(&name, &n))
		return n
	}
	before := created()
	for range 3 {
		applied, err := atomic.Update(ctx, mysqldb.Wrap(db), sameStock, "p")
		require.NoError(t, err)
		require.True(t, applied)
	}
	require.Equal(t, 1, created()-before, "checks made")
}

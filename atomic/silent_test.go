package atomic_test

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/internal/workload"
)

// The statements that scan a row into the caller's variables return by
// ctx's deadline when the network goes silent, as every other statement
// does: lib/pq, asked to cancel, waits for an answer a silent network
// never brings. Nothing is written into dest after they return.
func TestReadsReturnByTheDeadlineOnASilentNetwork(t *testing.T) {
	t.Parallel()
	const deadline = 300 * time.Millisecond
	calls := map[string]struct {
		silence func(*faultproxy.Proxy)
		call    func(ctx context.Context, driver string, h any, dest []any) error
		bound   time.Duration // after the deadline
	}{
		// One statement: the network is silent before it is sent.
		"UpdateReturning": {
			silence: func(p *faultproxy.Proxy) {
				p.Blackhole()
			},
			call: func(ctx context.Context, _ string, h any, dest []any) error {
				_, err := atomic.UpdateReturning(ctx, h, dest, decrement+` RETURNING stock`, "p")
				return err
			},
			bound: txn.CancelGrace,
		},
		// The update is answered, the read is not: the call returns as
		// promptly, and its transaction is rolled back in the background.
		"UpdateSelect": {
			silence: func(p *faultproxy.Proxy) {
				p.DropReplyTo("SELECT stock")
			},
			call: func(ctx context.Context, driver string, h any, dest []any) error {
				update, query := decrement, `SELECT stock FROM products WHERE id = $1`
				if driver == testserver.MariaDBDriver {
					update, query = mariaDecrement, `SELECT stock FROM products WHERE id = ?`
				}
				_, err := atomic.UpdateSelect(ctx, h, dest, update, []any{"p"}, query, "p")
				return err
			},
			bound: txn.CancelGrace,
		},
	}
	// The network is silent before the transaction begins.
	calls["UpdateSelect/silent-from-the-start"] = struct {
		silence func(*faultproxy.Proxy)
		call    func(ctx context.Context, driver string, h any, dest []any) error
		bound   time.Duration
	}{
		silence: func(p *faultproxy.Proxy) { p.Blackhole() },
		call:    calls["UpdateSelect"].call,
		bound:   txn.CancelGrace,
	}
	for name, c := range calls {
		drivers := testserver.AllDrivers
		if strings.HasPrefix(name, "UpdateSelect") {
			drivers = append(drivers, testserver.MariaDBDriver)
		}
		for _, driver := range drivers {
			t.Run(name+"/"+driver, func(t *testing.T) {
				t.Parallel()
				url := testserver.URL(t, driver)
				direct := testserver.Open(t, driver, url)
				if driver == testserver.MariaDBDriver {
					mariaProducts(t, direct, 5, "p")
				} else {
					workload.Products(t, direct, 5, "p")
				}
				// A proxy of its own, without Proxied's idle-in-transaction
				// timeout: the server waits as long as the client does.
				u, err := neturl.Parse(url)
				require.NoError(t, err)
				proxy := faultproxy.Start(t, u.Host)
				u.Host = proxy.Addr()
				proxied := u.String()
				h := testserver.Handle(t, driver, proxied)
				c.silence(proxy)

				ctx, cancel := context.WithTimeout(t.Context(), deadline)
				defer cancel()
				var left int
				done := make(chan error, 1)
				began := time.Now()
				go func() { done <- c.call(ctx, driver, h, []any{&left}) }()
				select {
				case err := <-done:
					took := time.Since(began)
					t.Logf("returned after %v: %v", took, err)
					require.ErrorIs(t, err, context.DeadlineExceeded)
					require.Less(t, took, deadline+c.bound+500*time.Millisecond)
				case <-time.After(deadline + c.bound + 2*time.Second):
					// Let the call return before the test ends.
					proxy.Reset()
					<-done
					t.Fatalf("still running %v after the deadline", time.Since(began)-deadline)
				}
				proxy.Reset() // a call given up on ends, and writes nothing the test reads
				proxy.Heal()

				// Nothing of the call was committed, and the pool hands out no
				// connection left in its transaction: the next call through the
				// same handle applies alone.
				stock := func() int64 {
					var n int64
					require.NoError(t, direct.Get(&n, direct.Rebind(`SELECT stock FROM products WHERE id = ?`), "p"))
					return n
				}
				require.EqualValues(t, 5, stock(), "a call given up on committed its write")
				ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				require.NoError(t, c.call(ctx, driver, h, []any{&left}))
				require.EqualValues(t, 4, left)
				require.EqualValues(t, 4, stock())
			})
		}
	}
}

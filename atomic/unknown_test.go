package atomic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
)

// A claim whose answer is lost after the server committed it: the caller
// cannot tell it was made, and cannot release a token Claim never returned.
// The claimer releases it itself, within its finish timeout (Close waits
// for that), so the key is free again rather than held by nobody: forever
// without a lease column, for the whole lease with one.
func TestClaimWhoseAnswerIsLostIsReleased(t *testing.T) {
	t.Parallel()
	const key = "k-answer-lost" // the request the proxy drops the answer to
	ops := map[string]func(context.Context, *atomic.Claimer) error{
		"Claim": func(ctx context.Context, c *atomic.Claimer) error {
			_, err := c.Claim(ctx, key)
			return err
		},
		"Do": func(ctx context.Context, c *atomic.Claimer) error {
			return c.Do(ctx, key, func(context.Context) error {
				t.Error("fn ran for a claim whose answer never came")
				return nil
			})
		},
	}
	configs := map[string]atomic.ClaimerConfig{
		"plain":  plain,
		"leased": {Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: time.Minute},
	}
	for _, driver := range append(testserver.AllDrivers, testserver.MariaDBDriver) {
		makeBots, ownerOf := bots, ownerOf
		if driver == testserver.MariaDBDriver {
			makeBots, ownerOf = mariaBots, mariaOwner
		}
		for cname, cfg := range configs {
			for oname, op := range ops {
				t.Run(driver+"/"+cname+"/"+oname, func(t *testing.T) {
					t.Parallel()
					url := testserver.URL(t, driver)
					direct := testserver.Open(t, driver, url)
					makeBots(t, direct, key)
					proxy, proxied := txntest.Proxied(t, url)
					cfg := cfg // the subtests of a configuration run at once
					cfg.FinishTimeout = 2 * time.Second
					released := make(chan struct{}, 1)
					cfg.Observer = contend.ObserverFunc(func(_ context.Context, e contend.Event) {
						if e.Kind == contend.EventReleased {
							released <- struct{}{}
						}
					})
					c, err := atomic.NewClaimer(testserver.Handle(t, driver, proxied), cfg)
					require.NoError(t, err)
					defer func() {
						// A statement lib/pq still waits for an answer to
						// holds its prepared statement open until its
						// connection breaks.
						proxy.Reset()
						require.NoError(t, c.Close(t.Context()))
					}()

					proxy.DropReplyTo(key)
					ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
					defer cancel()
					err = op(ctx, c)
					require.ErrorIs(t, err, context.DeadlineExceeded)
					t.Log(err)
					select {
					case <-released:
					case <-time.After(cfg.FinishTimeout + time.Second):
						owner := ownerOf(t, direct, key)
						require.Nil(t, owner, "not released within the finish timeout")
						t.Fatal("released, but nothing said so")
					}
					require.Nil(t, ownerOf(t, direct, key), "released")
				})
			}
		}
	}
}

package txn_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/internal/txn/txntest"
)

// The network goes silent while the transaction commits: no reply, no reset.
// Run returns by ctx's deadline plus the finish bound, not when the kernel
// gives up on the connection, and says the outcome is unknown; the server,
// which never got the COMMIT, rolls back and lets go of the locks once it
// notices the session is gone (here its idle_in_transaction_session_timeout).
func TestCommitIsBoundedWhenTheNetworkGoesSilent(t *testing.T) {
	for lock, driver := range testserver.Drivers {
		lock += 4300
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			direct := testserver.Open(t, driver, url)
			_, err := direct.Exec(`CREATE TABLE t (id int PRIMARY KEY, n int NOT NULL); INSERT INTO t VALUES (1, 0)`)
			require.NoError(t, err)
			proxy, proxied := txntest.Proxied(t, url)
			db := testserver.Open(t, driver, proxied)

			const deadline, bound = 500 * time.Millisecond, 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := txn.Run(ctx, db, txn.Options{FinishTimeout: bound}, func(ctx context.Context, tx contend.DBTX) error {
					if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lock); err != nil {
						return err
					}
					if err := bump(ctx, tx); err != nil {
						return err
					}
					proxy.Blackhole()
					return nil
				})
				done <- err
			}()
			select {
			case err = <-done:
			case <-time.After(deadline + bound + 2*time.Second):
				t.Fatalf("Run still waits for its COMMIT %v after it began, past ctx's deadline of %v and the bound of %v",
					time.Since(start), deadline, bound)
			}
			took := time.Since(start)
			t.Logf("%s: Run returned after %v: %v", driver, took, err)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, took, deadline+bound+200*time.Millisecond)

			// Nothing half-written, nothing held once the server noticed.
			require.Eventually(t, func() bool {
				var free bool
				return direct.Get(&free, `SELECT pg_try_advisory_xact_lock($1)`, lock) == nil && free
			}, txntest.IdleInTransaction+3*time.Second, 20*time.Millisecond, "the lock is still held")
			require.Zero(t, value(t, direct), "a commit the server never got was applied")
		})
	}
}

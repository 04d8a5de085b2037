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

// Update is one statement: the fault strikes just before it.
func TestUpdateUnderFaults(t *testing.T) {
	t.Parallel()
	txntest.Run(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, _ time.Duration) txntest.Op {
		return func(ctx context.Context, key string, fn txntest.Fn) error {
			if err := fn(ctx, nil); err != nil {
				return err
			}
			applied, err := atomic.Update(ctx, db, `UPDATE `+txntest.Table+` SET n = n + 1 WHERE id = $1`, key)
			if err == nil && !applied {
				t.Errorf("update of %s did not apply", key)
			}
			return err
		}
	}})
}

// The claimer's fn writes straight to the pool; what the faults test is the
// claim and its release.
func TestClaimerUnderFaults(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	txntest.Run(t, txntest.Subject{Lease: lease, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		c, err := atomic.NewClaimer(db, atomic.ClaimerConfig{
			Table: txntest.Table, OwnerColumn: "owner", LeaseColumn: "lease", Lease: lease, FinishTimeout: finish,
		})

		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
		return func(ctx context.Context, key string, fn txntest.Fn) error {
			return c.Do(ctx, key, func(ctx context.Context) error { return fn(ctx, testserver.Querier(ctx, db)) })
		}
	}})
}

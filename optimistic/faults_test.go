package optimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/optimistic"
)

func TestGuardUnderFaults(t *testing.T) {
	t.Parallel()
	txntest.Run(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		g, err := optimistic.NewGuard(db, optimistic.Config{Table: txntest.Table, FinishTimeout: finish})
		require.NoError(t, err)
		return func(ctx context.Context, key string, fn txntest.Fn) error {
			return g.Do(ctx, key, func(ctx context.Context) error { return fn(ctx, testserver.Querier(ctx, db)) })
		}
	}})
}

// item is a row of txntest.Table.
type item struct {
	ID      string     `db:"id"`
	N       int        `db:"n"`
	Version int64      `db:"version"`
	Owner   *string    `db:"owner"`
	Lease   *time.Time `db:"lease"`
}

// A Store writes with one version-checked UPDATE, outside any transaction:
// the fault strikes between its read and that write.
func TestStoreUnderFaults(t *testing.T) {
	t.Parallel()
	txntest.Run(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, _ time.Duration) txntest.Op {
		s, err := optimistic.NewStore[item](db, optimistic.Config{Table: txntest.Table})
		require.NoError(t, err)
		return func(ctx context.Context, key string, fn txntest.Fn) error {
			_, err := s.Update(ctx, key, func(v *item) error {
				v.N++
				return fn(ctx, nil)
			})
			return err
		}
	}})
}

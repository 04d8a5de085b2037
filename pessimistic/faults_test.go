package pessimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/pessimistic"
)

func TestRowLockUnderFaults(t *testing.T) {
	t.Parallel()
	txntest.Run(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		l, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: txntest.Table, FinishTimeout: finish})
		require.NoError(t, err)
		return guardOp(l, db)
	}})
}

func TestAdvisoryLockUnderFaults(t *testing.T) {
	t.Parallel()
	txntest.Run(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		a, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{FinishTimeout: finish})
		require.NoError(t, err)
		return guardOp(a, db)
	}})
}

func guardOp(g contend.Guard, db contend.DB) txntest.Op {
	return func(ctx context.Context, key string, fn txntest.Fn) error {
		return g.Do(ctx, key, func(ctx context.Context) error { return fn(ctx, testserver.Querier(ctx, db)) })
	}
}

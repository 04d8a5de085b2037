package atomic_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// The parallel tests wait on locks, leases, ctx deadlines and the fault
// suite's timers, each on a pool of a few connections: four at a time.
func TestMain(m *testing.M) { testserver.MainWaiting(m, 4) }

const decrement = `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`

func TestUpdate(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			workload.Products(t, db, 1, "p")
			ctx := t.Context()

			applied, err := atomic.Update(ctx, h, decrement, "p")
			require.NoError(t, err)
			require.True(t, applied)
			applied, err = atomic.Update(ctx, h, decrement, "p")
			require.NoError(t, err)
			require.False(t, applied, "sold out is a lost race, not an error")
			require.EqualValues(t, 0, workload.Stock(t, db, "p"))

			_, err = atomic.Update(ctx, h, `UPDATE nosuchtable SET x = 1`)
			require.Error(t, err, "backend errors are returned, not taken for a lost race")
		})
	}
}

// Update takes any of database/sql's and sqlx's pools and transactions.
func TestUpdateAcceptsPoolsAndTransactions(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	workload.Products(t, db, 10, "p")
	ctx := t.Context()

	sqlTx, err := db.DB.BeginTx(ctx, nil)
	require.NoError(t, err)
	sqlxTx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	for name, q := range map[string]contend.DBTX{"*sql.DB": db.DB, "*sqlx.DB": db} {
		applied, err := atomic.Update(ctx, q, decrement, "p")
		require.NoError(t, err, name)
		require.True(t, applied, name)
	}
	// The two transactions would wait on each other's row lock; run them in
	// turn.
	applied, err := atomic.Update(ctx, sqlTx, decrement, "p")
	require.NoError(t, err)
	require.True(t, applied)
	require.NoError(t, sqlTx.Rollback())
	applied, err = atomic.Update(ctx, sqlxTx, decrement, "p")
	require.NoError(t, err)
	require.True(t, applied)
	require.NoError(t, sqlxTx.Commit())
	require.EqualValues(t, 7, workload.Stock(t, db, "p"))
}

func TestUpdateN(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	workload.Products(t, db, 1, "a", "b", "c")
	ctx := t.Context()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	applied, err := atomic.UpdateN(ctx, tx, 2, `UPDATE products SET stock = stock - 1 WHERE id = ANY($1) AND stock >= 1`, []string{"a", "b"})
	require.NoError(t, err)
	require.True(t, applied)
	applied, err = atomic.UpdateN(ctx, tx, 2, `UPDATE products SET stock = stock - 1 WHERE id = ANY($1) AND stock >= 1`, []string{"b", "c"})
	require.NoError(t, err)
	require.False(t, applied, "only c had stock left")
	require.NoError(t, tx.Rollback())
}

func TestUpdateReturning(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			workload.Products(t, db, 2, "p")
			ctx := t.Context()
			q := decrement + ` RETURNING stock`
			left := -1
			applied, err := atomic.UpdateReturning(ctx, h, []any{&left}, q, "p")
			require.NoError(t, err)
			require.True(t, applied)
			require.Equal(t, 1, left)
			_, err = atomic.UpdateReturning(ctx, h, []any{&left}, q, "p")
			require.NoError(t, err)
			left = -1
			applied, err = atomic.UpdateReturning(ctx, h, []any{&left}, q, "p")
			require.NoError(t, err)
			require.False(t, applied)
			require.Equal(t, -1, left, "dest is untouched when nothing applied")
		})
	}
}

func TestUpdateRefusesNilDB(t *testing.T) {
	t.Parallel()
	_, err := atomic.Update(t.Context(), nil, decrement, "p")
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = atomic.UpdateReturning(t.Context(), nil, nil, decrement, "p")
	require.ErrorIs(t, err, contend.ErrInvalid)
}

// 64 goroutines in each of 3 processes decrement one hot row of stock 300:
// exactly 300 succeed, and the stock ends at 0, never below. An oversell
// would happen where the stock runs out, which all 192 goroutines race for
// whatever the stock; a larger one only makes the queue for the row longer.
func TestUpdateUnderContention(t *testing.T) {
	for _, driver := range testserver.PathDrivers {
		t.Run(driver, func(t *testing.T) {
			const stock = 300
			var db *sqlx.DB
			cfg := harness.Config{Processes: 3, Goroutines: 64, Ops: 2} // 384 attempts
			res := harness.Run(t, cfg,
				func() harness.Params {
					url := testserver.Postgres(t)
					db = testserver.Open(t, driver, url)
					workload.Products(t, db, stock, "hot")
					// The database enforces "never negative" too, so an
					// oversell would show up as errors, not pass silently.
					_, err := db.Exec(`ALTER TABLE products ADD CHECK (stock >= 0)`)
					require.NoError(t, err)
					return harness.Params{"url": url}
				},
				func(t testing.TB, p harness.Params) harness.Op {
					h := testserver.Handle(t, driver, p["url"])
					return func(ctx context.Context, key string) error {
						applied, err := atomic.Update(ctx, h, decrement, key)
						if err == nil && !applied {
							err = fmt.Errorf("sold out: %w", contend.ErrConflict)
						}
						return err
					}
				})
			t.Logf("sold %d, sold out %d, errors %d, p50 %v, p99 %v", res.Successes, res.Conflicts, res.Errors, res.Percentile(.5), res.Percentile(.99))
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Equal(t, stock, res.Successes)
			require.Equal(t, 3*64*2-stock, res.Conflicts)
			require.EqualValues(t, 0, workload.Stock(t, db, "hot"))
		})
	}
}

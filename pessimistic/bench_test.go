package pessimistic_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

// BenchmarkGuard pairs Locker.Do with `raw`, the same transaction written by
// hand with database/sql (BEGIN; SELECT ... FOR NO KEY UPDATE; UPDATE;
// COMMIT), in the same run: BenchmarkGuard/raw/spread/workers=8 beside
// BenchmarkGuard/pessimistic/spread/workers=8, so benchratio (or benchstat)
// shows the library's overhead as a ratio. Workloads: one hot row, or 1000
// rows picked at random; workers: goroutines running transactions at once,
// sharing a pool of testserver.MaxConns connections. Through pgx.

const bump = `UPDATE counters SET n = n + 1 WHERE id = $1`

func BenchmarkGuard(b *testing.B) {
	for _, impl := range []struct {
		name string
		new  func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key string) error
	}{
		{"raw", rawLocked(false)},
		// raw-bounded is raw keeping the promise the library keeps about
		// time: its COMMIT waits at most a bound, kept by a timer that
		// cancels the transaction's context (pgx then closes the
		// connection). It is the floor of a bounded transaction; what it
		// costs beyond raw is the context and timer, and pgx watching a
		// context that can end.
		{"raw-bounded", rawLocked(true)},
		{"pessimistic", func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key string) error {
			l := newLocker(b, db, pessimistic.LockerConfig{Table: "counters"})
			return func(ctx context.Context, key string) error {
				return l.Do(ctx, key, func(ctx context.Context) error {
					_, err := contend.Querier(ctx, db).ExecContext(ctx, bump, key)
					return err
				})
			}
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range []int{1, 8, 64} {
						b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
							db := counters(b, w.Keys)
							op := impl.new(b, db)
							workload.Parallel(b, workers, func(ctx context.Context) error { return op(ctx, w.Pick()) })
						})
					}
				})
			}
		})
	}
}

// rawLocked is BenchmarkGuard's transaction written by hand: begin, lock
// the row, bump it, commit. bounded bounds the COMMIT with a timer, as the
// guard does.
func rawLocked(bounded bool) func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key string) error {
	return func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			txCtx, done := workload.TxContext(ctx, bounded, 5*time.Second)
			defer done()
			tx, err := db.BeginTx(txCtx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM counters WHERE id = $1 FOR NO KEY UPDATE`, key).Scan(&one); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, bump, key); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
}

// counters makes a pool on a fresh schema with a counter row per key.
func counters(b *testing.B, keys []string) *sqlx.DB {
	db := testserver.DB(b, "pgx")
	_, err := db.Exec(`CREATE TABLE counters (id text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	require.NoError(b, err)
	_, err = db.Exec(`INSERT INTO counters (id) SELECT unnest($1::text[])`, pq.Array(keys))
	require.NoError(b, err)
	return db
}

package pessimistic_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pessimistic"
)

// BenchmarkAdvisoryOnMariaDB pairs the Advisory guard on MariaDB with `raw`,
// the same work written by hand: a connection held for the call, GET_LOCK,
// a READ COMMITTED transaction that bumps a counter, RELEASE_LOCK, the
// connection given back. BenchmarkAdvisoryOnMariaDB/raw/hot/workers=8
// beside BenchmarkAdvisoryOnMariaDB/advisory/hot/workers=8 shows the
// guard's overhead as a ratio.
func BenchmarkAdvisoryOnMariaDB(b *testing.B) {
	const bumpMaria = "UPDATE counters SET n = n + 1 WHERE id = ?"
	for _, impl := range []struct {
		name string
		new  func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error
	}{
		{"raw", func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			return func(ctx context.Context, key string) error {
				c, err := h.DB.Conn(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				var got bool
				if err := c.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", 60)", key).Scan(&got); err != nil || !got {
					return errors.Join(errors.New("GET_LOCK failed"), err)
				}
				tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, bumpMaria, key); err != nil {
					_ = tx.Rollback()
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				_, err = c.ExecContext(ctx, "DO RELEASE_LOCK("+lockName+")", key)
				return err
			}
		}},
		{"advisory", func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
			require.NoError(b, err)
			return func(ctx context.Context, key string) error {
				return a.Do(ctx, key, func(ctx context.Context) error {
					_, err := contend.Querier(ctx, h.DB).ExecContext(ctx, bumpMaria, key)
					return err
				})
			}
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range []int{1, 8} {
						b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
							h := testserver.Handle(b, testserver.MariaDBDriver, testserver.MariaDB(b)).(testserver.MariaDBHandle)
							mariaRows(b, h.DB, "counters", w.Keys...)
							op := impl.new(b, h)
							workload.Parallel(b, workers, func(ctx context.Context) error { return op(ctx, w.Pick()) })
						})
					}
				})
			}
		})
	}
}

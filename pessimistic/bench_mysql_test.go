package pessimistic_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
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
	benchOnMariaDB(b, []workload.MariaDBImpl{
		{Name: "raw", New: rawAdvisory(false)},
		// raw-bounded keeps the guard's promise about time: its COMMIT is
		// given up on after a bound, which under go-sql-driver/mysql takes
		// a goroutine (database/sql's COMMIT takes no ctx).
		{Name: "raw-bounded", New: rawAdvisory(true)},
		{Name: "advisory", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
			require.NoError(b, err)
			return func(ctx context.Context, key string) error {
				return a.Do(ctx, key, func(ctx context.Context) error {
					_, err := contend.Querier(ctx, h.DB).ExecContext(ctx, bumpMaria, key)
					return err
				})
			}
		}},
	})
}

// rawAdvisory is BenchmarkAdvisoryOnMariaDB's raw side; bounded gives up on
// its COMMIT after a bound.
func rawAdvisory(bounded bool) func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
	return func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
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
			if err := commit(tx, bounded); err != nil {
				return err
			}
			_, err = c.ExecContext(ctx, "DO RELEASE_LOCK("+lockName+")", key)
			return err
		}
	}
}

// rawLocker is BenchmarkGuardOnMariaDB's raw side; bounded gives up on its
// COMMIT after a bound.
func rawLocker(bounded bool) func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
	return func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			tx, err := h.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var one int
			if err := tx.QueryRowContext(ctx, "SELECT 1 FROM counters WHERE id = ? FOR UPDATE", key).Scan(&one); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, bumpMaria, key); err != nil {
				return err
			}
			return commit(tx, bounded)
		}
	}
}

func commit(tx *sql.Tx, bounded bool) error {
	if bounded {
		return workload.EndWithin(tx.Commit, 5*time.Second)
	}
	return tx.Commit()
}

// bumpMaria is the work each benchmarked call does on MariaDB.
const bumpMaria = "UPDATE counters SET n = n + 1 WHERE id = ?"

// BenchmarkGuardOnMariaDB pairs the row Locker's Do on MariaDB with `raw`,
// the same transaction written by hand: BEGIN at READ COMMITTED (the
// Locker's default on MySQL), SELECT ... FOR UPDATE, the bump, COMMIT.
func BenchmarkGuardOnMariaDB(b *testing.B) {
	benchOnMariaDB(b, []workload.MariaDBImpl{
		{Name: "raw", New: rawLocker(false)},
		{Name: "raw-bounded", New: rawLocker(true)},
		{Name: "pessimistic", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "counters"})
			require.NoError(b, err)
			return func(ctx context.Context, key string) error {
				return l.Do(ctx, key, func(ctx context.Context) error {
					_, err := contend.Querier(ctx, h.DB).ExecContext(ctx, bumpMaria, key)
					return err
				})
			}
		}},
	})
}

// benchOnMariaDB runs impls on a counters table of each cell's own.
func benchOnMariaDB(b *testing.B, impls []workload.MariaDBImpl) {
	workload.OnMariaDB(b, func(b testing.TB, db *sqlx.DB, keys []string) {
		workload.MariaDBTable(b, db, "counters", "n bigint NOT NULL DEFAULT 0", keys...)
	}, impls)
}

package atomic_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// The MariaDB benchmarks pair each call with `raw`, the same statements by
// hand through go-sql-driver/mysql, as the PostgreSQL ones do; the library
// is given the pool wrapped by mysqldb.Wrap.

// BenchmarkUpdateOnMariaDB is BenchmarkUpdate on MariaDB.
func BenchmarkUpdateOnMariaDB(b *testing.B) {
	workload.OnMariaDB(b, func(b testing.TB, db *sqlx.DB, keys []string) {
		workload.MariaDBTable(b, db, "products", "stock bigint NOT NULL DEFAULT 1099511627776", keys...)
	}, []workload.MariaDBImpl{
		{Name: "raw", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			return func(ctx context.Context, key string) error {
				res, err := h.DB.ExecContext(ctx, mariaDecrement, key)
				if err == nil {
					err = applied(res)
				}
				return err
			}
		}},
		{Name: "contend", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			db := contend.DB(h) // as an application keeps mysqldb.Wrap's value: boxed once
			return func(ctx context.Context, key string) error {
				ok, err := atomic.Update(ctx, db, mariaDecrement, key)
				if err == nil && !ok {
					err = errors.New("not applied")
				}
				return err
			}
		}},
	})
}

// applied says whether res is one row's.
func applied(res sql.Result) error {
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(errors.New("not applied"), err)
	}
	return nil
}

// BenchmarkClaimReleaseOnMariaDB is BenchmarkClaimRelease on MariaDB. There
// is no UPDATE ... RETURNING there, so the claimer tells a missing row from
// a lost race with a second statement, and only a claim that matched no row
// pays it: raw-probe is raw doing that by hand, the floor of a claim that
// makes the distinction.
func BenchmarkClaimReleaseOnMariaDB(b *testing.B) {
	const (
		claimSQL   = "UPDATE bots SET engine_id = ? WHERE id = ? AND engine_id IS NULL"
		existsSQL  = "SELECT EXISTS (SELECT 1 FROM bots WHERE id = ?)"
		releaseSQL = "UPDATE bots SET engine_id = NULL WHERE id = ? AND engine_id = ?"
	)
	byHand := func(probe bool) func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
		return func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			wins.Store(0)
			claim, exists, release := prepare(b, h.DB, claimSQL), prepare(b, h.DB, existsSQL), prepare(b, h.DB, releaseSQL)
			return func(ctx context.Context, key string) error {
				token := strconv.FormatUint(rand.Uint64(), 16)
				res, err := claim.ExecContext(ctx, token, key)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil {
					return err
				} else if n == 1 {
					wins.Add(1)
					_, err = release.ExecContext(ctx, key, token)
					return err
				}
				if !probe {
					return nil
				}
				var found bool
				return exists.QueryRowContext(ctx, key).Scan(&found)
			}
		}
	}
	workload.OnMariaDB(b, func(b testing.TB, db *sqlx.DB, keys []string) {
		workload.MariaDBTable(b, db, "bots", "engine_id varchar(64)", keys...)
	}, []workload.MariaDBImpl{
		{Name: "raw", New: byHand(false), Report: reportWins},
		{Name: "raw-probe", New: byHand(true), Report: reportWins},
		{Name: "contend", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			wins.Store(0)
			return claimRelease(claimer(b, h, plain))
		}, Report: reportWins},
	})
}

package optimistic_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
)

// The MariaDB benchmarks are BenchmarkUpdate's and BenchmarkGuard's on
// MariaDB, through go-sql-driver/mysql, the library given the pool wrapped
// by mysqldb.Wrap; the floors are the same statements by hand, the guard's
// transactions at READ COMMITTED, its default there.

var mariaSQL = benchSQL{
	readBalance:  "SELECT balance FROM accounts WHERE id = ?",
	writeBalance: "UPDATE accounts SET balance = ? WHERE id = ?",
	read:         "SELECT id, owner, balance, version FROM accounts WHERE id = ?",
	write:        "UPDATE accounts SET owner = ?, balance = ?, version = version + 1 WHERE id = ? AND version = ?",
	readVersion:  "SELECT version FROM accounts WHERE id = ?",
	bump:         "UPDATE accounts SET version = version + 1 WHERE id = ? AND version = ?",
	txOptions:    &sql.TxOptions{Isolation: sql.LevelReadCommitted},
	positional:   true,
}

func benchOnMariaDB(b *testing.B, impls ...workload.MariaDBImpl) {
	workload.OnMariaDB(b, func(b testing.TB, db *sqlx.DB, keys []string) {
		workload.MariaDBTable(b, db, "accounts",
			"owner varchar(64) NOT NULL DEFAULT 'ann', balance bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0", keys...)
	}, impls)
}

// BenchmarkUpdateOnMariaDB is BenchmarkUpdate on MariaDB.
func BenchmarkUpdateOnMariaDB(b *testing.B) {
	var attempts atomic.Int64
	benchOnMariaDB(b,
		workload.MariaDBImpl{Name: "raw", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			return mariaSQL.rawUpdate(h.DB, &attempts)
		}},
		workload.MariaDBImpl{Name: "optimistic", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			s, err := optimistic.NewStore[account](h, optimistic.Config{Table: "accounts", Retry: benchRetry, Observer: countInto(&attempts)})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(a *account) error { a.Balance++; return nil })
				return err
			}
		}})
}

// BenchmarkGuardOnMariaDB is BenchmarkGuard on MariaDB.
func BenchmarkGuardOnMariaDB(b *testing.B) {
	var attempts atomic.Int64
	raw := func(bounded bool) func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
		return func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			return mariaSQL.rawGuard(mariaSQL.increment, bounded)(b, h.DB, &attempts)
		}
	}
	benchOnMariaDB(b,
		workload.MariaDBImpl{Name: "raw", New: raw(false)},
		workload.MariaDBImpl{Name: "raw-bounded", New: raw(true)},
		workload.MariaDBImpl{Name: "optimistic", New: func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error {
			g, err := optimistic.NewGuard(h, optimistic.Config{Table: "accounts", Retry: benchRetry, Observer: countInto(&attempts)})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				return g.Do(ctx, key, func(ctx context.Context) error {
					return mariaSQL.increment(ctx, contend.Querier(ctx, h.DB), key)
				})
			}
		}})
}

package adaptive_test

import (
	"database/sql"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

var mariaWords = words{
	read:       "SELECT n FROM counters WHERE id = ?",
	write:      "UPDATE counters SET n = ? WHERE id = ?",
	lockedRead: "SELECT n FROM counters WHERE id = ? FOR UPDATE",
	bump:       "UPDATE counters SET version = version + 1 WHERE id = ?",
	positional: true,
	// The guards' transactions' isolation on MySQL and MariaDB.
	txOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
}

// BenchmarkDecrementOnMariaDB is BenchmarkDecrement on MariaDB, through
// go-sql-driver/mysql, the library given the pool wrapped by mysqldb.Wrap.
func BenchmarkDecrementOnMariaDB(b *testing.B) {
	decrementBench(b, mariaWords.impls(), workload.MariaDBWorkers, func(b *testing.B, keys []string) (*sqlx.DB, contend.DB) {
		h := testserver.Handle(b, testserver.MariaDBDriver, testserver.MariaDB(b)).(testserver.MariaDBHandle)
		workload.MariaDBTable(b, h.DB, "counters", "n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0", keys...)
		return h.DB, h
	})
}

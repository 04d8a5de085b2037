package workload

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend/internal/testserver"
)

// A MariaDBImpl builds one side of a MariaDB benchmark: an operation on a
// key, through h (a pool wrapped by mysqldb.Wrap, as an application wraps
// its pool) or its bare pool h.DB.
type MariaDBImpl struct {
	Name string
	New  func(b *testing.B, h testserver.MariaDBHandle) func(ctx context.Context, key string) error
	// Report, when set, runs after each cell's operations, to report
	// metrics of the impl's own (b.ReportMetric).
	Report func(b *testing.B)
}

// MariaDBWorkers are the worker counts of the MariaDB benchmarks.
var MariaDBWorkers = []int{1, 8}

// OnMariaDB runs each impl on the hot key and on spread keys, from each of
// MariaDBWorkers, every cell on a database of its own that setup fills with
// a row per key. Impls are siblings: OnMariaDB/raw/spread/workers=8 beside
// OnMariaDB/pessimistic/spread/workers=8 gives the library's overhead as a
// ratio.
func OnMariaDB(b *testing.B, setup func(b testing.TB, db *sqlx.DB, keys []string), impls []MariaDBImpl) {
	for _, impl := range impls {
		b.Run(impl.Name, func(b *testing.B) {
			for _, w := range Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range MariaDBWorkers {
						b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
							h := testserver.Handle(b, testserver.MariaDBDriver, testserver.MariaDB(b)).(testserver.MariaDBHandle)
							setup(b, h.DB, w.Keys)
							op := impl.New(b, h)
							Parallel(b, workers, func(ctx context.Context) error { return op(ctx, w.Pick()) })
							if impl.Report != nil {
								impl.Report(b)
							}
						})
					}
				})
			}
		})
	}
}

// MariaDBTable creates table on MariaDB, keyed by id, with columns (SQL
// column definitions after the id's; each needs a default), and a row per
// id, inserted 500 to a statement.
func MariaDBTable(t testing.TB, db *sqlx.DB, table, columns string, ids ...string) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE " + table + " (id varchar(191) PRIMARY KEY, " + columns + ")"); err != nil {
		t.Fatalf("workload: create %s: %v", table, err)
	}
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 500)]
		ids = ids[len(batch):]
		q := "INSERT INTO " + table + " (id) VALUES (?)" + strings.Repeat(", (?)", len(batch)-1)
		args := make([]any, len(batch))
		for i, id := range batch {
			args[i] = id
		}
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("workload: fill %s: %v", table, err)
		}
	}
}

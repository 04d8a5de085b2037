// Package workload holds what every strategy's tests, examples and benchmarks
// run against: the products table of the oversell story and the two key
// choices, one hot key or many spread keys.
package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
)

// TxContext returns the context a hand-written transaction begins under,
// and a func to call when it is over. bounded: the transaction keeps the
// guards' promise about time, its COMMIT abandoned after bound by a timer
// that cancels the context (pgx then closes the connection), as the
// library's is; the raw-bounded benchmarks measure that floor. Otherwise ctx
// itself.
func TxContext(ctx context.Context, bounded bool, bound time.Duration) (context.Context, func()) {
	if !bounded {
		return ctx, func() {}
	}
	txCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	t := time.AfterFunc(bound, abandon)
	return txCtx, func() { t.Stop(); abandon() }
}

// EndWithin is the bound TxContext keeps, for a driver whose COMMIT and
// ROLLBACK take no ctx (lib/pq, go-sql-driver/mysql, through database/sql):
// end runs on a goroutine of its own and is given up on after bound, by
// the library's own means ([txn.Within]), since no other way exists there.
// It is the floor of a transaction that keeps the guards' promise about
// time on those drivers.
func EndWithin(end func() error, bound time.Duration) error {
	return txn.Within("commit", bound, end, func() {})
}

// Hot is the key of the one row every worker fights over.
const Hot = "hot"

// Keys returns n keys: prefix followed by 0 to n-1.
func Keys(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = prefix + strconv.Itoa(i)
	}
	return ks
}

// A Choice picks the key of each operation.
type Choice struct {
	Name string
	Keys []string // every key the choice can pick: create a row for each
	Pick func() string
}

// Choices are the benchmarks' workloads: "hot", one key; "spread", 1000 keys
// picked at random.
func Choices() []Choice {
	spread := Keys("k", 1000)
	return []Choice{
		{Name: "hot", Keys: []string{Hot}, Pick: func() string { return Hot }},
		{Name: "spread", Keys: spread, Pick: func() string { return spread[rand.IntN(len(spread))] }},
	}
}

// ProductsTable creates the products table: one row per id holding stock.
func ProductsTable(ctx context.Context, db *sqlx.DB, stock int64, ids ...string) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE products (id text PRIMARY KEY, stock bigint NOT NULL)`); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `INSERT INTO products (id, stock) SELECT unnest($1::text[]), $2`, sqlident.TextArray(ids), stock)
	return err
}

// Products creates the products table for t.
func Products(t testing.TB, db *sqlx.DB, stock int64, ids ...string) {
	t.Helper()
	if err := ProductsTable(t.Context(), db, stock, ids...); err != nil {
		t.Fatalf("workload: products: %v", err)
	}
}

// Stock returns id's stock.
func Stock(t testing.TB, db *sqlx.DB, id string) int64 {
	t.Helper()
	var n int64
	if err := db.Get(&n, `SELECT stock FROM products WHERE id = $1`, id); err != nil {
		t.Fatalf("workload: stock of %s: %v", id, err)
	}
	return n
}

// Scratch opens a pool on a fresh schema of the test server, runs setup in
// it, and returns the pool with a function that closes it and drops the
// schema. It is for Example functions, which have no *testing.T; it panics
// when no server can be had.
func Scratch(setup string) (*sqlx.DB, func()) {
	url, drop, err := testserver.Schema(context.Background())
	if err != nil {
		panic(err)
	}
	db := sqlx.MustOpen("pgx", url)
	db.SetMaxOpenConns(4)
	db.MustExec(setup)
	return db, func() {
		db.Close()
		if err := drop(); err != nil {
			panic(err)
		}
	}
}

// Parallel runs op b.N times from workers goroutines: a plain loop for one,
// else RunParallel with parallelism ⌈workers / GOMAXPROCS⌉ (so workers is
// rounded up to a multiple of GOMAXPROCS).
//
// The plain loop counts to b.N rather than use b.Loop: callers size their
// records by b.N before calling (a latency per operation), and under b.Loop
// b.N is not the number of operations until the loop has ended, so a
// percentile of a single worker's latencies would be its first call's.
func Parallel(b *testing.B, workers int, op func(ctx context.Context) error) {
	ctx := context.Background()
	b.ResetTimer()
	if workers <= 1 {
		for range b.N {
			if err := op(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((workers + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// ErrSoldOut is a sale's lost race: nothing left.
var ErrSoldOut = fmt.Errorf("sold out: %w", contend.ErrConflict)

// Sell is the naive read-check-write, through whatever transaction a
// guard hands it (or db): read the stock, refuse when none is left, write back
// what was read minus one. Unguarded, two callers read the same stock and one
// sale is lost; it is correct only under a guard.
func Sell(db contend.DBTX) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		return SellOn(ctx, contend.Querier(ctx, db), key)
	}
}

// SellVia is [SellOn] on a querier of any driver (testserver.Querier).
func SellVia(ctx context.Context, q sqldb.Querier, key string) error {
	var n int64
	if err := q.QueryRow(ctx, `SELECT stock FROM products WHERE id = $1`, key).Scan(&n); err != nil {
		return err
	}
	if n < 1 {
		return ErrSoldOut
	}
	_, err := q.Exec(ctx, `UPDATE products SET stock = $2 WHERE id = $1`, key, n-1)
	return err
}

// SellOn is Sell's read-check-write on q itself, whatever ctx carries.
func SellOn(ctx context.Context, q contend.DBTX, key string) error {
	var n int64
	if err := q.QueryRowContext(ctx, `SELECT stock FROM products WHERE id = $1`, key).Scan(&n); err != nil {
		return err
	}
	if n < 1 {
		return ErrSoldOut
	}
	_, err := q.ExecContext(ctx, `UPDATE products SET stock = $2 WHERE id = $1`, key, n-1)
	return err
}

// Guarded runs body for key under g: the one call site every guard shares.
func Guarded(g contend.Guard, body func(ctx context.Context, key string) error) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		return g.Do(ctx, key, func(ctx context.Context) error { return body(ctx, key) })
	}
}

// MutexGuard is the naive guard: one sync.Mutex per process, which keeps this
// process's goroutines apart and nothing else. The zero value is ready.
type MutexGuard struct{ mu sync.Mutex }

// Do runs fn holding the process's mutex.
func (g *MutexGuard) Do(ctx context.Context, _ string, fn func(context.Context) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return fn(ctx)
}

// SellN sells min($2, stock) of product $1 in one statement and returns how
// many it sold: the row lock of the subquery makes reading the old stock and
// writing the new one one step, so the count is right however many sellers
// run. The queue's batch handlers sell a batch's buys of a product with it.
const SellN = `UPDATE products p SET stock = p.stock - least(old.stock, $2)
	FROM (SELECT stock FROM products WHERE id = $1 FOR UPDATE) old
	WHERE p.id = $1
	RETURNING old.stock - p.stock`

// Each runs fn(0) … fn(n-1) on n goroutines at once, waits for all of them,
// and fails t with every error they returned.
func Each(t testing.TB, n int, fn func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

package adaptive_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
)

// The benchmarks run one decrement, a read of a counter and a write of it
// minus one, inside each guard's Do, through contend.Querier, so the fixed
// guards and the adaptive one run the same fn: BenchmarkDecrement/adaptive/hot/workers=64
// beside BenchmarkDecrement/pessimistic/hot/workers=64 and
// BenchmarkDecrement/optimistic/hot/workers=64. `raw` is the transaction
// written by hand: begin, read the row under its lock, write, commit, the
// least a correct decrement in a transaction costs. pessimistic-bump is the
// floor of the adaptive guard's locked path (see below). Workloads: one hot row,
// or 1000 rows picked at random ("spread"); BenchmarkShift turns from spread
// to hot halfway.
//
// Every side retries under the same policy (contend's default delays, a
// budget no run exhausts) and runs on pgx's stdlib driver, through a pool of
// testserver.MaxConns connections. p99-ms is the 99th percentile of a Do's
// latency.

var benchRetry = contend.Retry{MaxAttempts: 100_000}

// benchCounters makes the counters table with a row per key. Its sessions
// commit without waiting for the WAL flush: the disk is shared with
// everyone else's tests, and its fsync latency would swamp the work compared.
func benchCounters(b *testing.B, keys []string) *sqlx.DB {
	db := testserver.Open(b, "pgx", testserver.Postgres(b)+"&synchronous_commit=off")
	_, err := db.Exec(`CREATE TABLE counters (id text PRIMARY KEY, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0)`)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO counters (id) SELECT unnest($1::text[])`, pq.Array(keys)); err != nil {
		b.Fatal(err)
	}
	return db
}

// decrement is the fn every guard runs.
func decrement(db *sqlx.DB, key string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var n int64
		if err := q.QueryRowContext(ctx, `SELECT n FROM counters WHERE id = $1`, key).Scan(&n); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, `UPDATE counters SET n = $2 WHERE id = $1`, key, n-1)
		return err
	}
}

// An op does one decrement of key.
type op func(ctx context.Context, key string) error

// An impl builds an op on db. An adaptive one adds the calls it runs locked
// to locked, so that the benchmark reports how many did.
type impl struct {
	name string
	new  func(b *testing.B, db *sqlx.DB, locked *atomic.Int64) op
}

func guarded(g contend.Guard, db *sqlx.DB) op {
	return func(ctx context.Context, key string) error { return g.Do(ctx, key, decrement(db, key)) }
}

var impls = []impl{
	{"raw", func(b *testing.B, db *sqlx.DB, _ *atomic.Int64) op {
		return func(ctx context.Context, key string) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var n int64
			if err := tx.QueryRowContext(ctx, `SELECT n FROM counters WHERE id = $1 FOR NO KEY UPDATE`, key).Scan(&n); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE counters SET n = $2 WHERE id = $1`, key, n-1); err != nil {
				return err
			}
			return tx.Commit()
		}
	}},
	{"optimistic", func(b *testing.B, db *sqlx.DB, _ *atomic.Int64) op {
		g, err := optimistic.NewGuard(db, optimistic.Config{Table: "counters", Retry: benchRetry})
		if err != nil {
			b.Fatal(err)
		}
		return guarded(g, db)
	}},
	{"pessimistic", func(b *testing.B, db *sqlx.DB, _ *atomic.Int64) op {
		l, err := pessimistic.New(db, pessimistic.Config{Table: "counters", Retry: benchRetry})
		if err != nil {
			b.Fatal(err)
		}
		return guarded(l, db)
	}},
	// The floor of the adaptive guard's locked path: the row lock, fn, and
	// the version bump that keeps optimistic writers of the key from
	// committing on a read the locked writer made stale. It costs a second
	// row version per transaction, which pessimistic alone does not write.
	{"pessimistic-bump", func(b *testing.B, db *sqlx.DB, _ *atomic.Int64) op {
		l, err := pessimistic.New(db, pessimistic.Config{Table: "counters", Retry: benchRetry})
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, key string) error {
			return l.Do(ctx, key, func(ctx context.Context) error {
				if err := decrement(db, key)(ctx); err != nil {
					return err
				}
				_, err := contend.Querier(ctx, db).ExecContext(ctx, `UPDATE counters SET version = version + 1 WHERE id = $1`, key)
				return err
			})
		}
	}},
	{"adaptive", func(b *testing.B, db *sqlx.DB, locked *atomic.Int64) op {
		g, err := adaptive.NewGuard(db, adaptive.Config{Table: "counters", Retry: benchRetry})
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, key string) error {
			if g.Mode(key) == adaptive.Pessimistic {
				locked.Add(1)
			}
			return g.Do(ctx, key, decrement(db, key))
		}
	}},
}

// run runs op b.N times from workers goroutines, on the key pick(i) names for
// the i-th operation, and reports the 99th percentile of their latencies and,
// for the adaptive guard, the share of calls that began locked.
func run(b *testing.B, workers int, pick func(i int64) string, op op, name string, locked *atomic.Int64) {
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	workload.Parallel(b, workers, func(ctx context.Context) error {
		i := next.Add(1) - 1
		start := time.Now()
		err := op(ctx, pick(i))
		if i < int64(len(lat)) {
			lat[i] = time.Since(start)
		}
		return err
	})
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100])/float64(time.Millisecond), "p99-ms")
	if name == "adaptive" {
		b.ReportMetric(100*float64(locked.Load())/float64(b.N), "locked-%")
	}
}

// BenchmarkDecrement compares the guards on one hot key and on spread keys.
func BenchmarkDecrement(b *testing.B) {
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range []int{8, 64} {
						b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
							var locked atomic.Int64
							op := im.new(b, benchCounters(b, w.Keys), &locked)
							b.ResetTimer()
							run(b, workers, func(int64) string { return w.Pick() }, op, im.name, &locked)
						})
					}
				})
			}
		})
	}
}

// BenchmarkShift is a sale: the first half of the operations go to 1000 keys
// at random, the second half all to one of them.
func BenchmarkShift(b *testing.B) {
	keys := workload.Keys("k", 1000)
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for _, workers := range []int{8, 64} {
				b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
					var locked atomic.Int64
					op := im.new(b, benchCounters(b, keys), &locked)
					half := int64(b.N / 2)
					b.ResetTimer()
					run(b, workers, func(i int64) string {
						if i < half {
							return keys[rand.IntN(len(keys))]
						}
						return keys[0]
					}, op, im.name, &locked)
				})
			}
		})
	}
}

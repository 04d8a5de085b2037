package adaptive_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
)

// BenchmarkThink is where the guards differ in production: fn reads the
// row, waits thinkTime (a stand-in for a call to another service), and
// writes it, with 64 workers sharing a pool of testserver.MaxConns (10)
// connections, on 1000 rows:
//   - think: every call on a row picked at random;
//   - mixed: 30% of the calls on one hot row, the rest on the 1000 cold
//     ones; cold-p99-ms is the 99th percentile of the cold calls' latency,
//     hot-ops/s the hot row's throughput;
//   - shift: the first half of the calls spread, the second half all on
//     one row.
//
// `raw` is the locked transaction written by hand (BEGIN; SELECT n ... FOR
// NO KEY UPDATE; wait; UPDATE; COMMIT), each waiter holding a connection,
// as pessimistic-noqueue does. pessimistic queues a hot row's waiters in the
// process (the default). Every cell checks, at its end, that no decrement
// was lost.
func BenchmarkThink(b *testing.B) {
	const think = 2 * time.Millisecond
	const workers = 64
	spread := workload.Keys("k", 1000)
	hotKey := spread[0]
	cells := []struct {
		name string
		pick func(i, n int64) string
	}{
		{"think", func(_, _ int64) string { return spread[rand.IntN(len(spread))] }},
		{"mixed", func(_, _ int64) string {
			if rand.IntN(10) < 3 {
				return hotKey
			}
			return spread[1+rand.IntN(len(spread)-1)]
		}},
		{"shift", func(i, n int64) string {
			if i < n/2 {
				return spread[rand.IntN(len(spread))]
			}
			return hotKey
		}},
	}
	w := postgresWords
	for _, im := range w.thinkImpls(think) {
		b.Run(im.name, func(b *testing.B) {
			for _, c := range cells {
				b.Run(fmt.Sprintf("%s/workers=%d", c.name, workers), func(b *testing.B) {
					db := benchCounters(b, spread)
					op := im.new(b, db, db, nil)
					var hot, done atomic.Int64
					lat := make([]time.Duration, b.N)
					isHot := make([]bool, b.N)
					var next atomic.Int64
					n := int64(b.N)
					b.ResetTimer()
					workload.Parallel(b, workers, func(ctx context.Context) error {
						i := next.Add(1) - 1
						key := c.pick(i, n)
						start := time.Now()
						err := op(ctx, key)
						if err == nil {
							done.Add(1)
							if key == hotKey {
								hot.Add(1)
							}
						}
						if i < n {
							lat[i], isHot[i] = time.Since(start), key == hotKey
						}
						return err
					})
					b.StopTimer()
					secs := b.Elapsed().Seconds()
					b.ReportMetric(float64(done.Load())/secs, "ops/s")
					b.ReportMetric(float64(hot.Load())/secs, "hot-ops/s")
					var cold []time.Duration
					for i, d := range lat {
						if !isHot[i] && d > 0 {
							cold = append(cold, d)
						}
					}
					if len(cold) > 0 {
						slices.Sort(cold)
						b.ReportMetric(float64(cold[len(cold)*99/100])/float64(time.Millisecond), "cold-p99-ms")
					}
					var sum int64
					if err := db.Get(&sum, `SELECT -sum(n) FROM counters`); err != nil {
						b.Fatal(err)
					}
					if sum != done.Load() {
						b.Fatalf("lost updates: %d decrements done, the counters show %d", done.Load(), sum)
					}
				})
			}
		})
	}
}

// thinkImpls are BenchmarkThink's sides: each runs a decrement that waits
// think between its read and its write.
func (w words) thinkImpls(think time.Duration) []impl {
	slow := func(db *sqlx.DB, key string) func(ctx context.Context) error {
		return func(ctx context.Context) error { return w.thinkOn(ctx, contend.Querier(ctx, db), key, w.read, think) }
	}
	guarded := func(g contend.Guard, db *sqlx.DB) op {
		return func(ctx context.Context, key string) error { return g.Do(ctx, key, slow(db, key)) }
	}
	locker := func(noQueue bool) func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
		return func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "counters", Retry: benchRetry, NoLocalQueue: noQueue})
			if err != nil {
				b.Fatal(err)
			}
			return guarded(l, db)
		}
	}
	return []impl{
		{"raw", func(b *testing.B, db *sqlx.DB, _ contend.DB, _ *atomic.Int64) op {
			return func(ctx context.Context, key string) error {
				return w.inTx(ctx, db, func(tx *sql.Tx) error { return w.thinkOn(ctx, tx, key, w.lockedRead, think) })
			}
		}},
		{"pessimistic", locker(false)},
		{"pessimistic-noqueue", locker(true)},
		{"optimistic", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			g, err := optimistic.NewGuard(h, optimistic.Config{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return guarded(g, db)
		}},
		{"adaptive", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			g, err := adaptive.NewGuard(h, adaptive.Config{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return guarded(g, db)
		}},
	}
}

// thinkOn is decrementOn with a wait of think between the read and the
// write.
func (w words) thinkOn(ctx context.Context, q contend.DBTX, key, read string, think time.Duration) error {
	var n int64
	if err := q.QueryRowContext(ctx, read, key).Scan(&n); err != nil {
		return err
	}
	time.Sleep(think)
	args := []any{key, n - 1}
	if w.positional {
		args = []any{n - 1, key}
	}
	_, err := q.ExecContext(ctx, w.write, args...)
	return err
}

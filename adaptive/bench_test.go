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
// least a correct decrement in a transaction costs. raw-bump is the floor of
// the adaptive guard's locked path, written by hand: begin, move the row's
// version (which takes its lock), read, write, commit. adaptive-locked is the
// guard with every call in locked mode, to set beside it; pessimistic-bump is
// package pessimistic's lock with the bump after fn, one statement more
// inside the lock. Workloads: one hot row,
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

// words are the benchmarks' statements in a server's words.
type words struct {
	read, write, lockedRead, bump string         // key; key, n (positional: n, key); key; key
	positional                    bool           // placeholders bind in the order they appear (MySQL)
	txOptions                     *sql.TxOptions // raw's transactions'
}

var postgresWords = words{
	read:       `SELECT n FROM counters WHERE id = $1`,
	write:      `UPDATE counters SET n = $2 WHERE id = $1`,
	lockedRead: `SELECT n FROM counters WHERE id = $1 FOR NO KEY UPDATE`,
	bump:       `UPDATE counters SET version = version + 1 WHERE id = $1`,
}

// decrement is the fn every guard runs: q's read of key's counter, and its
// write of it minus one.
func (w words) decrement(db *sqlx.DB, key string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		return w.decrementOn(ctx, contend.Querier(ctx, db), key, w.read)
	}
}

func (w words) decrementOn(ctx context.Context, q contend.DBTX, key, read string) error {
	var n int64
	if err := q.QueryRowContext(ctx, read, key).Scan(&n); err != nil {
		return err
	}
	args := []any{key, n - 1}
	if w.positional {
		args = []any{n - 1, key}
	}
	_, err := q.ExecContext(ctx, w.write, args...)
	return err
}

// inTx runs body in a transaction written by hand, and commits it: the
// floors' transactions. Its COMMIT is bounded by a timer, as the guards'
// are.
func (w words) inTx(ctx context.Context, db *sqlx.DB, body func(tx *sql.Tx) error) error {
	txCtx, done := workload.TxContext(ctx, true, 5*time.Second)
	defer done()
	tx, err := db.BeginTx(txCtx, w.txOptions)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := body(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// An op does one decrement of key.
type op func(ctx context.Context, key string) error

// An impl builds an op on db (h, the handle the library is given, wraps it).
// An adaptive one adds the calls it runs locked to locked, so that the
// benchmark reports how many did.
type impl struct {
	name string
	new  func(b *testing.B, db *sqlx.DB, h contend.DB, locked *atomic.Int64) op
}

func (w words) guarded(g contend.Guard, db *sqlx.DB) op {
	return func(ctx context.Context, key string) error { return g.Do(ctx, key, w.decrement(db, key)) }
}

// impls are the benchmarks' sides, in w.
func (w words) impls() []impl {
	return []impl{
		{"raw", func(b *testing.B, db *sqlx.DB, _ contend.DB, _ *atomic.Int64) op {
			return func(ctx context.Context, key string) error {
				tx, err := db.BeginTx(ctx, w.txOptions)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := w.decrementOn(ctx, tx, key, w.lockedRead); err != nil {
					return err
				}
				return tx.Commit()
			}
		}},
		{"optimistic", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			g, err := optimistic.NewGuard(h, optimistic.Config{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return w.guarded(g, db)
		}},
		{"pessimistic", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return w.guarded(l, db)
		}},
		// The floor of the adaptive guard's locked path: the bump takes the
		// row lock and moves the version in one statement, then fn's read
		// and write, in a transaction written by hand. Its COMMIT is bounded
		// by a timer, as the guard's is (the promise about time both keep).
		{"raw-bump", func(b *testing.B, db *sqlx.DB, _ contend.DB, _ *atomic.Int64) op {
			return func(ctx context.Context, key string) error {
				return w.inTx(ctx, db, func(tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, w.bump, key); err != nil {
						return err
					}
					return w.decrementOn(ctx, tx, key, w.read)
				})
			}
		}},
		{"adaptive-locked", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			g, err := adaptive.NewGuard(h, adaptive.Config{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			g.Pin(adaptive.Pessimistic)
			return w.guarded(g, db)
		}},
		// Package pessimistic's lock, fn, and
		// the version bump that keeps optimistic writers of the key from
		// committing on a read the locked writer made stale. It costs a second
		// row version per transaction, which pessimistic alone does not write.
		{"pessimistic-bump", func(b *testing.B, db *sqlx.DB, h contend.DB, _ *atomic.Int64) op {
			l, err := pessimistic.NewLocker(h, pessimistic.LockerConfig{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				return l.Do(ctx, key, func(ctx context.Context) error {
					if err := w.decrement(db, key)(ctx); err != nil {
						return err
					}
					_, err := contend.Querier(ctx, db).ExecContext(ctx, w.bump, key)
					return err
				})
			}
		}},
		{"adaptive", func(b *testing.B, db *sqlx.DB, h contend.DB, locked *atomic.Int64) op {
			g, err := adaptive.NewGuard(h, adaptive.Config{Table: "counters", Retry: benchRetry})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				if g.Mode(key) == adaptive.Pessimistic {
					locked.Add(1)
				}
				return g.Do(ctx, key, w.decrement(db, key))
			}
		}},
	}
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
	decrementBench(b, postgresWords.impls(), []int{1, 8, 64}, func(b *testing.B, keys []string) (*sqlx.DB, contend.DB) {
		db := benchCounters(b, keys)
		return db, db
	})
}

// decrementBench runs impls on the hot key and on spread keys from each of
// workers, on the counters open makes for the keys: a pool, and the handle
// the library is given.
func decrementBench(b *testing.B, impls []impl, workers []int, open func(b *testing.B, keys []string) (*sqlx.DB, contend.DB)) {
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, n := range workers {
						b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
							var locked atomic.Int64
							db, h := open(b, w.Keys)
							op := im.new(b, db, h, &locked)
							b.ResetTimer()
							run(b, n, func(int64) string { return w.Pick() }, op, im.name, &locked)
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
	for _, im := range postgresWords.impls() {
		b.Run(im.name, func(b *testing.B) {
			for _, workers := range []int{8, 64} {
				b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
					var locked atomic.Int64
					db := benchCounters(b, keys)
					op := im.new(b, db, db, &locked)
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

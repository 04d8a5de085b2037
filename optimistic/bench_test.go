package optimistic_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
)

// Benchmarks pair each library call with `raw`, the same statements and retry
// loop written by hand with database/sql, in the same run:
// BenchmarkUpdate/raw/spread/workers=8 beside
// BenchmarkUpdate/optimistic/spread/workers=8, so examples/benchratio shows
// the library's overhead as a ratio. Workloads: one hot row, or 1000 rows
// picked at random ("spread"). attempts/op is the attempts each successful
// operation took: 1 when nobody raced, and what a hot key costs otherwise.
//
// Both sides retry under the same policy (contend's default delays, a budget
// no run exhausts) and run on pgx's stdlib driver, through a pool of
// testserver.MaxConns connections.

var benchRetry = contend.Retry{MaxAttempts: 100_000}

// benchAccounts makes the accounts table with the hot row and the spread rows.
// Its sessions commit without waiting for the WAL flush: the disk is shared
// with everyone else's tests, and its fsync latency would swamp the client's
// work that the ratios are about.
func benchAccounts(b *testing.B, keys []string) *sqlx.DB {
	db := testserver.Open(b, "pgx", testserver.Postgres(b)+"&synchronous_commit=off")
	accounts(b, db)
	_, err := db.Exec(`INSERT INTO accounts (id, owner, balance) SELECT unnest($1::text[]), 'ann', 0`,
		pq.Array(keys))
	if err != nil {
		b.Fatal(err)
	}
	return db
}

// An op does one operation on key.
type op func(ctx context.Context, key string) error

// An impl builds an op on db that adds the attempts each operation takes to
// attempts.
type impl struct {
	name string
	new  func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op
}

func bench(b *testing.B, impls []impl) {
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, workers := range []int{1, 8, 64} {
						b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
							var attempts atomic.Int64
							op := im.new(b, benchAccounts(b, w.Keys), &attempts)
							run(b, workers, w.Pick, op, &attempts)
						})
					}
				})
			}
		})
	}
}

// run runs op b.N times from workers goroutines and reports attempts/op.
func run(b *testing.B, workers int, key func() string, op op, attempts *atomic.Int64) {
	var successes atomic.Int64
	attempts.Store(0)
	workload.Parallel(b, workers, func(ctx context.Context) error {
		err := op(ctx, key())
		if err == nil {
			successes.Add(1)
		}
		return err
	})
	b.StopTimer()
	if s := successes.Load(); s > 0 {
		b.ReportMetric(float64(attempts.Load())/float64(s), "attempts/op")
	}
}

// rawRetry is the hand-written floors' retry: run attempt until it applies,
// under benchRetry, counting every attempt.
func rawRetry(ctx context.Context, attempts *atomic.Int64, attempt func() (bool, error)) error {
	for n := 1; ; n++ {
		attempts.Add(1)
		applied, err := attempt()
		if err != nil || applied {
			return err
		}
		if n >= benchRetry.Attempts() {
			return contend.ErrConflict
		}
		if err := benchRetry.Wait(ctx, n); err != nil {
			return err
		}
	}
}

// BenchmarkUpdate adds 1 to an account's balance: Store.Update beside its
// read and version-checked UPDATE written by hand.
func BenchmarkUpdate(b *testing.B) {
	bench(b, []impl{
		{"raw", func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op { return postgresSQL.rawUpdate(db, attempts) }},
		{"optimistic", func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op {
			s, err := optimistic.NewStore[account](db, optimistic.Config{Table: "accounts", Retry: benchRetry, Observer: countInto(attempts)})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(a *account) error { a.Balance++; return nil })
				return err
			}
		}},
	})
}

// BenchmarkGuard runs a read-modify-write of an account's balance inside
// Guard.Do, beside the same transaction written by hand: begin, read the
// version, read and write the balance, check and bump the version, commit,
// or roll back and start over.
func BenchmarkGuard(b *testing.B) {
	increment := postgresSQL.increment
	bench(b, []impl{
		{"raw", postgresSQL.rawGuard(increment, false)},
		// raw-bounded is raw keeping the promise the guard keeps about time:
		// its COMMIT waits at most a bound, kept by a timer that cancels the
		// transaction's context (pgx then closes the connection). It is the
		// floor of a bounded transaction.
		{"raw-bounded", postgresSQL.rawGuard(increment, true)},
		{"optimistic", func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op {
			g, err := optimistic.NewGuard(db, optimistic.Config{Table: "accounts", Retry: benchRetry, Observer: countInto(attempts)})
			if err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				return g.Do(ctx, key, func(ctx context.Context) error {
					return increment(ctx, contend.Querier(ctx, db), key)
				})
			}
		}},
	})
}

// countInto returns a Config.Observer that adds each call's attempts to n.
func countInto(n *atomic.Int64) contend.Observer {
	return contend.ObserverFunc(func(_ context.Context, e contend.Event) {
		if e.Kind != contend.EventRetry {
			n.Add(int64(e.Attempts))
		}
	})
}

// benchSQL is what the hand-written floors say, in a server's words.
type benchSQL struct {
	readBalance, writeBalance string         // key; key, balance
	read, write               string         // Store.Update's: key; key, version, owner, balance
	readVersion, bump         string         // the guard's: key; key, version
	txOptions                 *sql.TxOptions // the guard's transactions'
	positional                bool           // placeholders bind in the order they appear (MySQL)
}

var postgresSQL = benchSQL{
	readBalance:  `SELECT balance FROM accounts WHERE id = $1`,
	writeBalance: `UPDATE accounts SET balance = $2 WHERE id = $1`,
	read:         `SELECT id, owner, balance, version FROM accounts WHERE id = $1`,
	write:        `UPDATE accounts SET owner = $3, balance = $4, version = version + 1 WHERE id = $1 AND version = $2`,
	readVersion:  `SELECT version FROM accounts WHERE id = $1`,
	bump:         `UPDATE accounts SET version = version + 1 WHERE id = $1 AND version = $2`,
}

// increment reads key's balance and writes it back plus one: fn of the
// guard benchmarks.
func (s benchSQL) increment(ctx context.Context, q contend.DBTX, key string) error {
	var balance int64
	if err := q.QueryRowContext(ctx, s.readBalance, key).Scan(&balance); err != nil {
		return err
	}
	args := []any{key, balance + 1}
	if s.positional {
		args = []any{balance + 1, key}
	}
	_, err := q.ExecContext(ctx, s.writeBalance, args...)
	return err
}

// rawUpdate is BenchmarkUpdate's read and version-checked UPDATE written by
// hand, on one connection, until it applies.
func (s benchSQL) rawUpdate(db *sqlx.DB, attempts *atomic.Int64) op {
	return func(ctx context.Context, key string) error {
		return rawRetry(ctx, attempts, func() (bool, error) {
			conn, err := db.Conn(ctx)
			if err != nil {
				return false, err
			}
			defer conn.Close()
			var a account
			if err := conn.QueryRowContext(ctx, s.read, key).Scan(&a.ID, &a.Owner, &a.Balance, &a.Version); err != nil {
				return false, err
			}
			a.Balance++
			// The arguments in the order the placeholders bind: by number
			// on PostgreSQL, by position on MySQL.
			var res sql.Result
			if s.positional {
				res, err = conn.ExecContext(ctx, s.write, a.Owner, a.Balance, key, a.Version)
			} else {
				res, err = conn.ExecContext(ctx, s.write, key, a.Version, a.Owner, a.Balance)
			}
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 1, err
		})
	}
}

// rawGuard is BenchmarkGuard's transaction written by hand: begin, read the
// version, fn, check and bump the version, commit, or roll back and start
// over. bounded bounds the COMMIT with a timer, as the guard does: through
// the transaction's context under pgx, through a goroutine under
// go-sql-driver/mysql, whose COMMIT takes no ctx.
func (s benchSQL) rawGuard(fn func(ctx context.Context, q contend.DBTX, key string) error, bounded bool) func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op {
	return func(b *testing.B, db *sqlx.DB, attempts *atomic.Int64) op {
		return func(ctx context.Context, key string) error {
			return rawRetry(ctx, attempts, func() (applied bool, err error) {
				txCtx, done := workload.TxContext(ctx, bounded, 5*time.Second)
				defer done()
				tx, err := db.BeginTx(txCtx, s.txOptions)
				if err != nil {
					return false, err
				}
				defer func() {
					if !applied {
						_ = tx.Rollback()
					}
				}()
				var version int64
				if err := tx.QueryRowContext(ctx, s.readVersion, key).Scan(&version); err != nil {
					return false, err
				}
				if err := fn(ctx, tx, key); err != nil {
					return false, err
				}
				res, err := tx.ExecContext(ctx, s.bump, key, version)
				if err != nil {
					return false, err
				}
				if n, err := res.RowsAffected(); err != nil || n == 0 {
					return false, err
				}
				if bounded && s.positional {
					// database/sql's COMMIT takes no ctx: the bound
					// needs a goroutine, as the guard's does.
					return true, workload.EndWithin(tx.Commit, 5*time.Second)
				}
				return true, tx.Commit()
			})
		}
	}
}

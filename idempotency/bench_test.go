package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/testserver"
)

// Benchmarks pair each call with `raw`, its floor written by hand with
// database/sql in the same run, on pgx's stdlib driver with
// synchronous_commit off (the shared disk's fsync would swamp the client's
// work):
//
//   - BenchmarkFirstCall: a new key each time, so every call runs fn; raw is
//     the bare transaction (BEGIN, fn's INSERT, COMMIT). raw-floor is the
//     least a first call can send when a replay is one round trip and runs
//     no fn: the replay read, then BEGIN, fn's INSERT, the record's
//     INSERT, COMMIT; but there a duplicate in flight runs its fn beside
//     the first (its writes rolled back at its record's conflict).
//     raw-exclusive is the floor of the store's own promise, that a
//     duplicate in flight waits for the key before its fn runs: the replay
//     read, BEGIN, the key's INSERT, fn's INSERT, the answer's UPDATE,
//     COMMIT, which is what the store sends.
//   - BenchmarkReplay: a key with a stored answer; raw is the primary-key
//     SELECT of the answer, which is what the store sends.
//
// The retry storm (each request sent three times, beside a hand-written
// check-then-insert and a unique-index insert, the invariant checked per
// cell) is a workload of the suite: go run ./examples/bench -workloads
// retry-storm.

func benchEnv(b *testing.B) *env {
	url := testserver.Postgres(b) + "&synchronous_commit=off"
	e := &env{driver: "pgx", url: url, own: testserver.Open(b, "pgx", url), dialect: testserver.Dialect("pgx")}
	createTables(b, e.own, e.dialect)
	e.db = e.own
	return e
}

// parallel runs op b.N times from workers goroutines.
func parallel(b *testing.B, workers int, op func(ctx context.Context, i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// The floors' statements; each takes the key ($1), the fingerprint ($2),
// the retention in microseconds ($3) and the answer ($4), and uses those it
// needs.
const (
	recordSQL = `INSERT INTO idem (id, fingerprint, state, answer, fence, expires_at)
		VALUES ($1, $2, 1, $4, 1, clock_timestamp() + $3::bigint * interval '1 microsecond') ON CONFLICT DO NOTHING`
	takeSQL = `INSERT INTO idem (id, fingerprint, state, answer, fence, expires_at)
		VALUES ($1, $2, 0, NULL, 1, clock_timestamp() + $3::bigint * interval '1 microsecond') ON CONFLICT DO NOTHING`
	answerSQL = `UPDATE idem SET state = 1, answer = $4 WHERE id = $1 AND fingerprint = $2 AND $3::bigint > 0`
)

var retention = int64(24 * time.Hour / time.Microsecond)

func BenchmarkFirstCall(b *testing.B) {
	for _, workers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("raw/workers=%d", workers), func(b *testing.B) {
			e := benchEnv(b)
			parallel(b, workers, func(ctx context.Context, i int64) error {
				tx, err := e.own.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, fmt.Sprint(i), "fp", "a"); err != nil {
					return err
				}
				return tx.Commit()
			})
		})
		for _, floor := range []struct {
			name   string
			before string // sent after BEGIN, before fn's statement
			after  string // sent after fn's statement, before COMMIT
		}{
			{"raw-floor", "", recordSQL},
			{"raw-exclusive", takeSQL, answerSQL},
		} {
			b.Run(fmt.Sprintf("%s/workers=%d", floor.name, workers), func(b *testing.B) {
				e := benchEnv(b)
				parallel(b, workers, func(ctx context.Context, i int64) error {
					key := fmt.Sprint(i)
					var answer []byte
					switch err := e.own.QueryRowContext(ctx, `SELECT answer FROM idem WHERE id = $1`, key).Scan(&answer); {
					case err == nil:
						return fmt.Errorf("key %s has a record", key)
					case !errors.Is(err, sql.ErrNoRows):
						return err
					}
					tx, err := e.own.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if floor.before != "" {
						if _, err := tx.ExecContext(ctx, floor.before, key, "fp", retention); err != nil {
							return err
						}
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, key, "fp", "a"); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, floor.after, key, "fp", retention, []byte("a")); err != nil {
						return err
					}
					return tx.Commit()
				})
			})
		}
		b.Run(fmt.Sprintf("idempotency/workers=%d", workers), func(b *testing.B) {
			e := benchEnv(b)
			s := e.store(b, idempotency.Config{})
			parallel(b, workers, func(ctx context.Context, i int64) error {
				key := fmt.Sprint(i)
				_, _, err := s.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
					_, err := testserver.Querier(ctx, e.db).Exec(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, key, "fp", "a")
					return []byte("a"), err
				})
				return err
			})
		})
	}
}

func BenchmarkReplay(b *testing.B) {
	const keys = 1000
	for _, workers := range []int{1, 8, 64} {
		setup := func(b *testing.B) (*env, *idempotency.Store) {
			e := benchEnv(b)
			s := e.store(b, idempotency.Config{})
			for i := range keys {
				if _, _, err := s.Do(context.Background(), fmt.Sprint(i), "fp", func(context.Context) ([]byte, error) {
					return []byte("the stored answer"), nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			return e, s
		}
		b.Run(fmt.Sprintf("raw/workers=%d", workers), func(b *testing.B) {
			e, _ := setup(b)
			parallel(b, workers, func(ctx context.Context, i int64) error {
				var answer []byte
				return e.own.QueryRowContext(ctx, `SELECT answer FROM idem WHERE id = $1`, fmt.Sprint(i%keys)).Scan(&answer)
			})
		})
		b.Run(fmt.Sprintf("idempotency/workers=%d", workers), func(b *testing.B) {
			_, s := setup(b)
			parallel(b, workers, func(ctx context.Context, i int64) error {
				_, replayed, err := s.Do(ctx, fmt.Sprint(i%keys), "fp", func(context.Context) ([]byte, error) {
					return nil, fmt.Errorf("fn ran on a replay")
				})
				if err == nil && !replayed {
					err = fmt.Errorf("not replayed")
				}
				return err
			})
		})
	}
}

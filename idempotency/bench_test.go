package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
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
//     INSERT, COMMIT. The store sends the replay read, BEGIN, the key's
//     INSERT, fn's INSERT, the answer's UPDATE, COMMIT: one statement more
//     than the floor, so that a duplicate in flight waits for the key
//     before its fn runs.
//   - BenchmarkReplay: a key with a stored answer; raw is the primary-key
//     SELECT of the answer, which is what the store sends.

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
		b.Run(fmt.Sprintf("raw-floor/workers=%d", workers), func(b *testing.B) {
			e := benchEnv(b)
			record := `INSERT INTO idem (id, fingerprint, state, answer, fence, expires_at)
				VALUES ($1, $2, 1, $3, 1, clock_timestamp() + $4::bigint * interval '1 microsecond') ON CONFLICT DO NOTHING`
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
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, key, "fp", "a"); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, record, key, "fp", []byte("a"), int64(24*time.Hour/time.Microsecond)); err != nil {
					return err
				}
				return tx.Commit()
			})
		})
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

// BenchmarkRetryStorm sends each request three times, two of them at once
// and the third after them (a double click, then a client's retry), and
// checks the invariant after each cell: one effect per request. Beside the
// store: check-then-insert by hand (the negative control: its duplicates
// are reported, not failed) and a unique-constraint insert by hand (one
// effect; its duplicates read the first one's answer back).
func BenchmarkRetryStorm(b *testing.B) {
	type sender func(ctx context.Context, e *env, key string) ([]byte, error)
	impls := []struct {
		name     string
		send     func(b *testing.B, e *env) sender
		mayDupes bool
	}{
		{"idempotency", func(b *testing.B, e *env) sender {
			s := e.store(b, idempotency.Config{})
			return func(ctx context.Context, e *env, key string) ([]byte, error) {
				a, _, err := s.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
					_, err := testserver.Querier(ctx, e.db).Exec(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, key, "fp", answerFor(key))
					return []byte("a-" + key), err
				})
				return a, err
			}
		}, false},
		{"check-then-insert", func(*testing.B, *env) sender {
			return func(ctx context.Context, e *env, key string) ([]byte, error) {
				var answer []byte
				err := e.own.QueryRowContext(ctx, `SELECT answer FROM effects WHERE k = $1 LIMIT 1`, key).Scan(&answer)
				if err == nil {
					return answer, nil
				}
				_, err = e.own.ExecContext(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`, key, "fp", answerFor(key))
				return []byte("a-" + key), err
			}
		}, true},
		{"unique-insert", func(b *testing.B, e *env) sender {
			if _, err := e.own.Exec(`CREATE UNIQUE INDEX ON effects (k)`); err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, e *env, key string) ([]byte, error) {
				var answer []byte
				err := e.own.QueryRowContext(ctx, `INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)
					ON CONFLICT (k) DO NOTHING RETURNING answer`, key, "fp", answerFor(key)).Scan(&answer)
				if err == nil {
					return answer, nil
				}
				err = e.own.QueryRowContext(ctx, `SELECT answer FROM effects WHERE k = $1`, key).Scan(&answer)
				return answer, err
			}
		}, false},
	}
	for _, im := range impls {
		for _, workers := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/workers=%d", im.name, workers), func(b *testing.B) {
				e := benchEnv(b)
				send := im.send(b, e)
				var split atomic.Int64 // requests whose three answers differ
				parallel(b, workers, func(ctx context.Context, i int64) error {
					key := fmt.Sprint(i)
					var answers [3][]byte
					var errs [3]error
					var wg sync.WaitGroup
					for j := range 2 {
						wg.Go(func() { answers[j], errs[j] = send(ctx, e, key) })
					}
					wg.Wait()
					answers[2], errs[2] = send(ctx, e, key)
					for j := range answers {
						if errs[j] != nil {
							return errs[j]
						}
						if string(answers[j]) != string(answers[0]) {
							split.Add(1)
						}
					}
					return nil
				})
				b.StopTimer()
				var dupes int
				if err := e.own.Get(&dupes, `SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM effects GROUP BY k) c`); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(dupes)/float64(b.N), "dupes/op")
				b.ReportMetric(float64(split.Load())/float64(b.N), "split/op")
				if (dupes > 0 || split.Load() > 0) && !im.mayDupes {
					b.Fatalf("%d duplicate effects, %d requests answered differently", dupes, split.Load())
				}
			})
		}
	}
}

// answerFor is the answer of one execution of key's request: another for
// each execution, so that a request run twice answers two ways.
func answerFor(key string) string { return fmt.Sprintf("a-%s-%d", key, rand.Int64()) }

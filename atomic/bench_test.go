package atomic_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// Benchmarks pair each library call with `raw`, the bare statement through
// database/sql, in the same run: BenchmarkUpdate/raw/hot/... beside
// BenchmarkUpdate/contend/hot/..., so benchstat shows the library's overhead
// as a ratio. 16 goroutines (8 per core) share the pool.

const benchParallelism = 8

func BenchmarkUpdate(b *testing.B) {
	for _, impl := range []struct {
		name   string
		update func(ctx context.Context, db *sqlx.DB, key string) error
	}{
		{"raw", func(ctx context.Context, db *sqlx.DB, key string) error {
			res, err := db.ExecContext(ctx, decrement, key)
			if err == nil {
				_, err = res.RowsAffected()
			}
			return err
		}},
		{"contend", func(ctx context.Context, db *sqlx.DB, key string) error {
			_, err := atomic.Update(ctx, db, decrement, key)
			return err
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, driver := range testserver.Drivers {
						b.Run("driver="+driver, func(b *testing.B) {
							db := testserver.DB(b, driver)
							workload.Products(b, db, 1<<40, w.Keys...)
							ctx := context.Background()
							b.SetParallelism(benchParallelism)
							b.ResetTimer()
							b.RunParallel(func(pb *testing.PB) {
								for pb.Next() {
									if err := impl.update(ctx, db, w.Pick()); err != nil {
										b.Error(err)
										return
									}
								}
							})
						})
					}
				})
			}
		})
	}
}

// BenchmarkClaimRelease claims a key and releases it again. raw prepares the
// same two statements by hand: the floor for a claimer, whose statements are
// fixed at construction.
func BenchmarkClaimRelease(b *testing.B) {
	const (
		claimSQL   = `UPDATE bots SET engine_id = $2 WHERE id = $1 AND engine_id IS NULL`
		releaseSQL = `UPDATE bots SET engine_id = NULL WHERE id = $1 AND engine_id = $2`
	)
	for _, impl := range []struct {
		name string
		new  func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key, token string) error
	}{
		{"raw", func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key, token string) error {
			claim, release := prepare(b, db, claimSQL), prepare(b, db, releaseSQL)
			return func(ctx context.Context, key, token string) error {
				res, err := claim.ExecContext(ctx, key, token)
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n == 1 {
					_, err = release.ExecContext(ctx, key, token)
				}
				return err
			}
		}},
		{"contend", func(b *testing.B, db *sqlx.DB) func(ctx context.Context, key, token string) error {
			c := claimer(b, db, plain)
			return func(ctx context.Context, key, token string) error {
				if err := c.ClaimAs(ctx, key, token); err != nil {
					return nil // a lost race is an outcome here, not a failure
				}
				_, err := c.Release(ctx, key, token)
				return err
			}
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, driver := range testserver.Drivers {
						b.Run("driver="+driver, func(b *testing.B) {
							db := testserver.DB(b, driver)
							bots(b, db, w.Keys...)
							op := impl.new(b, db)
							ctx := context.Background()
							b.SetParallelism(benchParallelism)
							b.ResetTimer()
							b.RunParallel(func(pb *testing.PB) {
								for pb.Next() {
									token := strconv.FormatUint(rand.Uint64(), 16)
									if err := op(ctx, w.Pick(), token); err != nil {
										b.Error(err)
										return
									}
								}
							})
						})
					}
				})
			}
		})
	}
}

func prepare(b *testing.B, db *sqlx.DB, query string) *sql.Stmt {
	s, err := db.Prepare(query)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

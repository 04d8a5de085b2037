package atomic_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strconv"
	gatomic "sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pgxdb"
)

// Benchmarks pair each library call with `raw`, the bare statement through
// the same driver, in the same run: BenchmarkUpdate/raw/hot/driver=pgx/workers=8
// beside BenchmarkUpdate/contend/hot/driver=pgx/workers=8, so benchratio (or
// benchstat) shows the library's overhead as a ratio. Under
// driver=pgx-native, raw is a *pgxpool.Pool's Exec and contend the same
// pool wrapped by pgxdb.Wrap. Workers share a pool of testserver.MaxConns
// connections.

var benchWorkers = []int{1, 8, 64}

// wins counts the claims won in the running benchmark, reported as wins/s
// beside ns/op: on the hot key most claims lose, and a claimer that lost
// more often would look faster per call.
var wins gatomic.Int64

// reportWins reports the claims won in the benchmark's run, per second.
func reportWins(b *testing.B) {
	if n := wins.Load(); n > 0 {
		b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "wins/s")
	}
}

// benchmark runs every impl on every workload, driver and worker count; newOp
// builds an impl's operation on a fresh database that setup prepared, given
// through driver as h (a testserver.Native pool under pgx-native, else db).
func benchmark(b *testing.B, impls, drivers []string, setup func(b *testing.B, db *sqlx.DB, keys []string),
	newOp func(b *testing.B, impl string, db *sqlx.DB, h contend.DB) func(ctx context.Context, key string) error) {
	for _, impl := range impls {
		b.Run(impl, func(b *testing.B) {
			for _, w := range workload.Choices() {
				b.Run(w.Name, func(b *testing.B) {
					for _, driver := range drivers {
						b.Run("driver="+driver, func(b *testing.B) {
							for _, workers := range benchWorkers {
								b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
									url := testserver.Postgres(b)
									db := testserver.Open(b, driver, url)
									setup(b, db, w.Keys)
									var h contend.DB = db
									if driver == testserver.PgxNative {
										h = testserver.OpenNative(b, url)
									}
									op := newOp(b, impl, db, h)
									wins.Store(0)
									workload.Parallel(b, workers, func(ctx context.Context) error { return op(ctx, w.Pick()) })
									reportWins(b)
								})
							}
						})
					}
				})
			}
		})
	}
}

func BenchmarkUpdate(b *testing.B) {
	benchmark(b, []string{"raw", "contend"}, testserver.AllDrivers,
		func(b *testing.B, db *sqlx.DB, keys []string) { workload.Products(b, db, 1<<40, keys...) },
		func(b *testing.B, impl string, db *sqlx.DB, h contend.DB) func(ctx context.Context, key string) error {
			if native, ok := h.(testserver.Native); ok {
				if impl == "raw" {
					return func(ctx context.Context, key string) error {
						tag, err := native.Pool.Exec(ctx, decrement, key)
						if err == nil && tag.RowsAffected() != 1 {
							err = errors.New("not applied")
						}
						return err
					}
				}
				db := pgxdb.Wrap(native.Pool) // as an application wraps its pool
				return func(ctx context.Context, key string) error {
					applied, err := atomic.Update(ctx, db, decrement, key)
					if err == nil && !applied {
						err = errors.New("not applied")
					}
					return err
				}
			}
			if impl == "raw" {
				return func(ctx context.Context, key string) error {
					res, err := db.ExecContext(ctx, decrement, key)
					if err == nil {
						_, err = res.RowsAffected()
					}
					return err
				}
			}
			return func(ctx context.Context, key string) error {
				_, err := atomic.Update(ctx, db, decrement, key)
				return err
			}
		})
}

// BenchmarkUpdateReturning is BenchmarkUpdate for a statement that returns
// the row it changed: raw scans it by hand, through the same driver. Both
// run under a ctx that can end, as a request's can: the library then
// watches the read on a driver whose statements outlive their ctx
// (lib/pq), and the driver watches the ctx too.
func BenchmarkUpdateReturning(b *testing.B) {
	const returning = decrement + ` RETURNING stock`
	benchmark(b, []string{"raw", "contend"}, testserver.AllDrivers,
		func(b *testing.B, db *sqlx.DB, keys []string) { workload.Products(b, db, 1<<40, keys...) },
		func(b *testing.B, impl string, db *sqlx.DB, h contend.DB) func(ctx context.Context, key string) error {
			canEnd, cancel := context.WithCancel(b.Context())
			b.Cleanup(cancel)
			op := updateReturning(impl, db, h, returning)
			return func(_ context.Context, key string) error { return op(canEnd, key) }
		})
}

// updateReturning is BenchmarkUpdateReturning's operation of impl.
func updateReturning(impl string, db *sqlx.DB, h contend.DB, returning string) func(ctx context.Context, key string) error {
	if native, ok := h.(testserver.Native); ok {
		if impl == "raw" {
			return func(ctx context.Context, key string) error {
				var left int64
				return native.Pool.QueryRow(ctx, returning, key).Scan(&left)
			}
		}
		db := pgxdb.Wrap(native.Pool)
		return func(ctx context.Context, key string) error {
			var left int64
			applied, err := atomic.UpdateReturning(ctx, db, []any{&left}, returning, key)
			if err == nil && !applied {
				err = errors.New("not applied")
			}
			return err
		}
	}
	if impl == "raw" {
		return func(ctx context.Context, key string) error {
			var left int64
			return db.QueryRowContext(ctx, returning, key).Scan(&left)
		}
	}
	return func(ctx context.Context, key string) error {
		var left int64
		applied, err := atomic.UpdateReturning(ctx, db, []any{&left}, returning, key)
		if err == nil && !applied {
			err = errors.New("not applied")
		}
		return err
	}
}

// BenchmarkClaimRelease claims a key and releases it again. raw prepares the
// same two statements by hand: the floor for a claimer, whose statements are
// fixed at construction (a claimer's claim that loses then asks whether the
// row exists, which raw leaves out). raw-probe is raw whose claim also tells
// a missing row from a lost race in its one round trip, as the statement
// that a hot key's claims share does: its
// claim answers in its count of rows (0 won, 1 lost, 2 no such row, or one
// free when the statement began: a second statement tells which, and is
// left out here, since no row of the benchmark goes), at the cost of an
// existence probe on the server for every loser. It is the floor
// of a claim that makes that distinction. On the hot key most claims lose; a
// lost race is an outcome here, not a failure.
func BenchmarkClaimRelease(b *testing.B) {
	const (
		claimSQL   = `UPDATE bots SET engine_id = $2 WHERE id = $1 AND engine_id IS NULL`
		releaseSQL = `UPDATE bots SET engine_id = NULL WHERE id = $1 AND engine_id = $2`
		probeSQL   = `WITH claimed AS (` + claimSQL + ` RETURNING 1) SELECT FROM (VALUES (1), (2)) AS outcome (n) ` +
			`WHERE NOT EXISTS (SELECT FROM claimed) AND (n = 1 OR NOT EXISTS (SELECT FROM bots WHERE id = $1 AND engine_id IS NULL IS NOT TRUE))`
	)
	// What a raw claim statement answers when it won.
	won := map[string]struct {
		claim string
		rows  int64
	}{"raw": {claimSQL, 1}, "raw-probe": {probeSQL, 0}}
	benchmark(b, []string{"raw", "raw-probe", "contend"}, testserver.AllDrivers,
		func(b *testing.B, db *sqlx.DB, keys []string) { bots(b, db, keys...) },
		func(b *testing.B, impl string, db *sqlx.DB, h contend.DB) func(ctx context.Context, key string) error {
			native, isNative := h.(testserver.Native)
			switch {
			case impl != "contend" && isNative:
				// pgx prepares and caches the statements by itself.
				w := won[impl]
				return func(ctx context.Context, key string) error {
					token := strconv.FormatUint(rand.Uint64(), 16)
					tag, err := native.Pool.Exec(ctx, w.claim, key, token)
					if err == nil && tag.RowsAffected() == w.rows {
						wins.Add(1)
						_, err = native.Pool.Exec(ctx, releaseSQL, key, token)
					}
					return err
				}
			case isNative:
				h = pgxdb.Wrap(native.Pool) // as an application wraps its pool
			}
			if impl != "contend" {
				w := won[impl]
				claim, release := prepare(b, db, w.claim), prepare(b, db, releaseSQL)
				return func(ctx context.Context, key string) error {
					token := strconv.FormatUint(rand.Uint64(), 16)
					res, err := claim.ExecContext(ctx, key, token)
					if err != nil {
						return err
					}
					if n, _ := res.RowsAffected(); n == w.rows {
						wins.Add(1)
						_, err = release.ExecContext(ctx, key, token)
					}
					return err
				}
			}
			return claimRelease(claimer(b, h, plain))
		})
}

// claimRelease claims a key as a fresh token and releases it again; a lost
// race is an outcome, not an error.
func claimRelease(c *atomic.Claimer) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		token := strconv.FormatUint(rand.Uint64(), 16)
		if err := c.ClaimAs(ctx, key, token); errors.Is(err, contend.ErrConflict) {
			return nil
		} else if err != nil {
			return err
		}
		wins.Add(1)
		_, err := c.Release(ctx, key, token)
		return err
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

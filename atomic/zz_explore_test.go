package atomic_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/pgxdb"
)

// Exploration only: losers on a row held for good (no wins, no lock waits),
// and the hot key with each loss's latency recorded.
func BenchmarkZZ(b *testing.B) {
	const (
		claimSQL   = `UPDATE bots SET engine_id = $2 WHERE id = $1 AND engine_id IS NULL`
		releaseSQL = `UPDATE bots SET engine_id = NULL WHERE id = $1 AND engine_id = $2`
		probeSQL   = `WITH claimed AS (` + claimSQL + ` RETURNING 1) SELECT FROM (VALUES (1), (2)) AS outcome (n) ` +
			`WHERE NOT EXISTS (SELECT FROM claimed) AND (n = 1 OR NOT EXISTS (SELECT FROM bots WHERE id = $1 AND engine_id IS NULL IS NOT TRUE))`
		readSQL = `SELECT engine_id IS NULL FROM bots WHERE id = $1`
	)
	for _, held := range []bool{true, false} {
		for _, impl := range []string{"raw", "raw-probe", "contend", "read"} {
			if impl == "read" && !held {
				continue
			}
			for _, driver := range []string{"pgx", testserver.PgxNative} {
				for _, workers := range []int{8, 64} {
					name := "losers"
					if !held {
						name = "hot"
					}
					b.Run(name+"/"+impl+"/driver="+driver+"/workers="+strconv.Itoa(workers), func(b *testing.B) {
						url := testserver.Postgres(b)
						db := testserver.Open(b, driver, url)
						bots(b, db, "hot")
						if held {
							db.MustExec(`UPDATE bots SET engine_id = 'someone'`)
						}
						var h contend.DB = db
						if driver == testserver.PgxNative {
							h = pgxdb.Wrap(testserver.OpenNative(b, url).Pool)
						}
						var mu sync.Mutex
						var lossLat, winLat []time.Duration
						var op func(ctx context.Context) (bool, error)
						won := map[string]int64{"raw": 1, "raw-probe": 0}
						q := map[string]string{"raw": claimSQL, "raw-probe": probeSQL}
						switch impl {
						case "contend":
							c := claimer(b, h, plain)
							op = func(ctx context.Context) (bool, error) {
								token := strconv.FormatUint(rand.Uint64(), 16)
								if err := c.ClaimAs(ctx, "hot", token); errors.Is(err, contend.ErrConflict) {
									return false, nil
								} else if err != nil {
									return false, err
								}
								_, err := c.Release(ctx, "hot", token)
								return true, err
							}
						case "read":
							s := prepare(b, db, readSQL)
							op = func(ctx context.Context) (bool, error) {
								var free bool
								return false, s.QueryRowContext(ctx, "hot").Scan(&free)
							}
						default:
							claim, release := prepare(b, db, q[impl]), prepare(b, db, releaseSQL)
							op = func(ctx context.Context) (bool, error) {
								token := strconv.FormatUint(rand.Uint64(), 16)
								res, err := claim.ExecContext(ctx, "hot", token)
								if err != nil {
									return false, err
								}
								if n, _ := res.RowsAffected(); n == won[impl] {
									_, err = release.ExecContext(ctx, "hot", token)
									return true, err
								}
								return false, nil
							}
						}
						sctx, stop := context.WithCancel(context.Background())
						waits := map[string]int{}
						var sampled sync.WaitGroup
						sampler := testserver.Open(b, "pgx", url)
						sampled.Go(func() {
							for sctx.Err() == nil {
								rows, err := sampler.QueryContext(sctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%bots%' AND pid <> pg_backend_pid()`)
								if err != nil {
									return
								}
								for rows.Next() {
									var w string
									_ = rows.Scan(&w)
									waits[w]++
								}
								rows.Close()
								time.Sleep(2 * time.Millisecond)
							}
						})
						workload.Parallel(b, workers, func(ctx context.Context) error {
							t0 := time.Now()
							w, err := op(ctx)
							d := time.Since(t0)
							mu.Lock()
							if w {
								winLat = append(winLat, d)
							} else {
								lossLat = append(lossLat, d)
							}
							mu.Unlock()
							return err
						})
						stop()
						sampled.Wait()
						total := 0
						for _, n := range waits {
							total += n
						}
						for w, n := range waits {
							if float64(n)/float64(total) > 0.02 {
								b.ReportMetric(float64(n)/float64(total), "w:"+w)
							}
						}
						el := b.Elapsed().Seconds()
						b.ReportMetric(float64(len(winLat))/el, "wins/s")
						b.ReportMetric(float64(len(lossLat)+len(winLat))/el, "ops/s")
						report := func(name string, l []time.Duration) {
							if len(l) == 0 {
								return
							}
							sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
							var sum, slow time.Duration
							for _, d := range l {
								sum += d
								if d > time.Millisecond {
									slow += d
								}
							}
							b.ReportMetric(float64(sum.Microseconds())/float64(len(l)), name+"-µs")
							b.ReportMetric(float64(l[len(l)/2].Microseconds()), name+"-p50µs")
							b.ReportMetric(float64(l[len(l)*99/100].Microseconds()), name+"-p99µs")
							b.ReportMetric(float64(slow)/float64(sum), name+"-slowfrac")
						}
						report("loss", lossLat)
						report("win", winLat)
					})
				}
			}
		}
	}
}

package harness_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

const stock = 100

// sell runs a harness load of sell-one-item operations against a fresh
// products row holding stock items, and returns the result and the stock left.
func sell(t *testing.T, cfg harness.Config, newSell func(db *sqlx.DB) harness.Op) (harness.Result, int) {
	var db *sqlx.DB
	res := harness.Run(t, cfg,
		func() harness.Params {
			url := testserver.Postgres(t)
			db = testserver.Open(t, "pgx", url)
			_, err := db.Exec(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL)`)
			require.NoError(t, err)
			_, err = db.Exec(`INSERT INTO products VALUES ('hot', $1)`, stock)
			require.NoError(t, err)
			return harness.Params{"url": url}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			return newSell(testserver.Open(t, "pgx", p["url"]))
		})
	var left int
	require.NoError(t, db.Get(&left, `SELECT stock FROM products WHERE id = 'hot'`))
	t.Logf("sold %d, sold out %d, errors %d, stock left %d (of %d)", res.Successes, res.Conflicts, res.Errors, left, stock)
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	return res, left
}

// naiveSell reads the stock, checks it and writes it back, in two statements,
// with a process-local mutex around them: correct in one process, wrong in
// several.
func naiveSell(db *sqlx.DB) harness.Op {
	var mu sync.Mutex
	return func(ctx context.Context, key string) error {
		mu.Lock()
		defer mu.Unlock()
		var n int
		if err := db.QueryRowContext(ctx, `SELECT stock FROM products WHERE id = $1`, key).Scan(&n); err != nil {
			return err
		}
		if n < 1 {
			return fmt.Errorf("sold out: %w", contend.ErrConflict)
		}
		time.Sleep(200 * time.Microsecond) // the time a real handler spends deciding
		_, err := db.ExecContext(ctx, `UPDATE products SET stock = $2 WHERE id = $1`, key, n-1)
		return err
	}
}

// conditionalSell is the fix, written out without the library: the check is
// part of the write.
func conditionalSell(db *sqlx.DB) harness.Op {
	return func(ctx context.Context, key string) error {
		res, err := db.ExecContext(ctx, `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, key)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("sold out: %w", contend.ErrConflict)
		}
		return nil
	}
}

// The negative control: with the mutex in one process only, three processes
// sell more than there is. If this passes, the harness can see the bug.
func TestNaiveMutexOversellsAcrossProcesses(t *testing.T) {
	res, left := sell(t, harness.Config{Processes: 3, Goroutines: 8, Ops: 10}, naiveSell)
	require.Greater(t, res.Successes, stock-left, "the naive sell must oversell across processes")
	require.Greater(t, res.Successes, stock, "more sold than there was")
}

// Calibration: in one process the mutex is enough, so the harness must not
// report an oversell there.
func TestNaiveMutexHoldsInOneProcess(t *testing.T) {
	res, left := sell(t, harness.Config{Goroutines: 8, Ops: 20}, naiveSell)
	require.Equal(t, stock, res.Successes)
	require.Zero(t, left)
}

func TestConditionalUpdateHoldsAcrossProcesses(t *testing.T) {
	res, left := sell(t, harness.Config{Processes: 3, Goroutines: 16, Ops: 4}, conditionalSell)
	require.Equal(t, stock, res.Successes)
	require.Zero(t, left)
	require.Equal(t, 3*16*4-stock, res.Conflicts)
	require.Len(t, res.Latencies, 3*16*4)
	require.LessOrEqual(t, res.Percentile(0.5), res.Percentile(0.99))
}

// Total shares a number of operations that need not divide evenly out among
// processes and goroutines.
func TestTotal(t *testing.T) {
	res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 4, Total: 100},
		func() harness.Params { return nil },
		func(testing.TB, harness.Params) harness.Op { return func(context.Context, string) error { return nil } })
	require.Equal(t, 100, res.Successes)
}

func TestSpreadAndRounds(t *testing.T) {
	t.Parallel()
	keys := []string{"a", "b", "c", "d"}
	var mu sync.Mutex
	seen := map[string]int{}
	res := harness.Local(t.Context(), harness.Config{Goroutines: 3, Ops: 8, Keys: keys}, func(_ context.Context, key string) error {
		mu.Lock()
		defer mu.Unlock()
		seen[key]++
		return nil
	})
	// In rounds every goroutine visits every key equally often.
	for _, k := range keys {
		require.Equal(t, 3*2, seen[k])
		require.Equal(t, 3*2, res.PerKey[k].Successes)
	}
	res = harness.Local(t.Context(), harness.Config{Goroutines: 2, Duration: 20 * time.Millisecond, Keys: keys, Spread: true},
		func(context.Context, string) error { return nil })
	require.Positive(t, res.Successes)
	require.Zero(t, res.Errors, "operations cut short by the run's own deadline are not failures")
}

// A run whose operations stop returning (a guard that lost a caller) stops
// waiting after Stall and says which calls were stuck, in one process and
// across processes, instead of hanging until go test's timeout.
func TestStalledRunIsReported(t *testing.T) {
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) }) // let the stuck calls go, for goleak
	op := func(ctx context.Context, key string) error {
		if key == "b" {
			<-stuck // never returns while the run watches
		}
		return nil
	}
	began := time.Now()
	res := harness.Local(t.Context(), harness.Config{Goroutines: 4, Ops: 3, Keys: []string{"a", "b"}, Stall: 300 * time.Millisecond}, op)
	require.Contains(t, res.Stalled, "4 calls still in flight (by key: map[b:4])")
	require.Less(t, time.Since(began), 5*time.Second)
}

// A worker process whose run stalls reports it, and the parent fails the
// test with its report: run as a child test that must fail.
func TestStalledWorkerFailsTheTest(t *testing.T) {
	if os.Getenv("HARNESS_STALL_CHILD") == "1" {
		harness.Run(t, harness.Config{Processes: 2, Goroutines: 2, Ops: 2, Stall: 300 * time.Millisecond},
			func() harness.Params { return nil },
			func(t testing.TB, _ harness.Params) harness.Op {
				return func(ctx context.Context, _ string) error { select {} }
			})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStalledWorkerFailsTheTest$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HARNESS_STALL_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the stalled run passed:\n%s", out)
	require.Contains(t, string(out), "harness: worker 0: no operation returned for 300ms: 2 calls still in flight")
}

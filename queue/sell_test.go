package queue_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
)

var (
	sold    = []byte("sold")
	soldOut = []byte("sold-out")
)

// seller is the batch handler of the hot-key fix: a batch's n pending buys of
// one product become one UPDATE, and the first min(n, stock) buyers, in
// submit order, are answered "sold". statements counts the UPDATEs.
func seller(db *sqlx.DB, statements *atomic.Int64) queue.BatchHandler {
	return func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
		var (
			order []string // keys, in order of first appearance
			count = map[string]int64{}
		)
		for _, j := range jobs {
			if count[j.Key] == 0 {
				order = append(order, j.Key)
			}
			count[j.Key]++
		}
		soldOf := make(map[string]int64, len(order))
		sell := func(ctx context.Context, q contend.DBTX) error {
			for _, k := range order {
				var n int64
				if err := q.QueryRowContext(ctx, workload.SellN, k, count[k]).Scan(&n); err != nil {
					return err
				}
				statements.Add(1)
				soldOf[k] = n
			}
			return nil
		}
		var err error
		if len(order) == 1 {
			err = sell(ctx, db) // one statement is atomic by itself
		} else {
			// Several products: all or none, so that a retried batch does not
			// sell the first product twice.
			_, err = txn.Run(ctx, db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error { return sell(ctx, tx) })
		}
		if err != nil {
			return nil, err
		}
		results := make([]queue.Result, len(jobs))
		for i, j := range jobs {
			if soldOf[j.Key] > 0 {
				soldOf[j.Key]--
				results[i].Value = sold
			} else {
				results[i].Value = soldOut
			}
		}
		return results, nil
	}
}

func products(t testing.TB, db *sqlx.DB, stock int64, ids ...string) {
	t.Helper()
	workload.Products(t, db, stock, ids...)
	// The database itself refuses a negative stock: "never negative" is
	// checked on every write, not only at the end.
	_, err := db.Exec(`ALTER TABLE products ADD CHECK (stock >= 0)`)
	require.NoError(t, err)
}

// The oversell workload, in one process and without a lock: stock 1000, 64
// buyers buying 20 times each through the queue. Exactly 1000 are sold, the
// stock ends at 0 and never went below (the CHECK), every buyer gets an
// answer, and the batch handler needed far fewer statements than buys.
func TestSellHotKeyWithBatches(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			const stock, buyers, buys = 1000, 64, 20
			db := testserver.DB(t, driver)
			products(t, db, stock, workload.Hot)
			var statements atomic.Int64
			q := start(t, queue.Config{Partitions: 16, BatchHandler: seller(db, &statements)})

			var (
				soldN, soldOutN atomic.Int64
				wg              sync.WaitGroup
				errs            = make(chan error, buyers*buys)
			)
			for range buyers {
				wg.Go(func() {
					for range buys {
						answer, err := q.Submit(t.Context(), workload.Hot, nil)
						switch {
						case err != nil:
							errs <- err
						case string(answer) == string(sold):
							soldN.Add(1)
						case string(answer) == string(soldOut):
							soldOutN.Add(1)
						default:
							errs <- errUnexpected(answer)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			t.Logf("sold %d, sold out %d, statements %d (%.1f buys per statement)",
				soldN.Load(), soldOutN.Load(), statements.Load(), float64(buyers*buys)/float64(statements.Load()))
			require.EqualValues(t, stock, soldN.Load())
			require.EqualValues(t, buyers*buys-stock, soldOutN.Load(), "every buyer got an answer")
			require.Zero(t, workload.Stock(t, db, workload.Hot))
			require.Less(t, statements.Load(), int64(buyers*buys/2), "batches must merge pending buys")
		})
	}
}

// Batches spanning several products sell each in the same transaction and
// answer each job for its own product.
func TestSellSeveralProductsInOneBatch(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 3, "a", "b")
	var statements atomic.Int64
	q, err := queue.New(queue.Config{Partitions: 1, BatchHandler: seller(db, &statements)})
	require.NoError(t, err)
	// Enqueued before Run, so the first batch holds them all.
	for _, k := range []string{"a", "b", "a", "a", "b", "a"} {
		require.NoError(t, q.Enqueue(t.Context(), k, nil))
	}
	require.NoError(t, q.Close(t.Context()))
	require.EqualValues(t, 2, statements.Load(), "one statement per product of the batch")
	require.Zero(t, workload.Stock(t, db, "a"))
	require.EqualValues(t, 1, workload.Stock(t, db, "b"))
}

var errPoison = errors.New("poison")

func errUnexpected(answer []byte) error { return fmt.Errorf("unexpected answer %q", answer) }

// A batch that fails is retried; when it keeps failing, its jobs run alone so
// only the poison job is dead-lettered and the others are answered.
func TestBatchPoisonIsolated(t *testing.T) {
	t.Parallel()
	dead := make(chan queue.DeadLetter, 4)
	q, err := queue.New(queue.Config{
		Partitions: 1,
		Retry:      fast,
		DeadLetter: func(d queue.DeadLetter) { dead <- d },
		BatchHandler: func(_ context.Context, jobs []queue.Job) ([]queue.Result, error) {
			res := make([]queue.Result, len(jobs))
			for i, j := range jobs {
				if string(j.Payload) == "poison" {
					return nil, errPoison
				}
				res[i].Value = j.Payload
			}
			return res, nil
		},
	})
	require.NoError(t, err)
	type answer struct {
		value []byte
		err   error
	}
	payloads := []string{"one", "poison", "three"}
	answers := make([]chan answer, len(payloads))
	for i, p := range payloads {
		answers[i] = make(chan answer, 1)
		go func() {
			v, err := q.Submit(t.Context(), "k", []byte(p))
			answers[i] <- answer{v, err}
		}()
		// Not running yet, so the buffer's depth says the job is in, in
		// order: all three then form one batch.
		for stats(t, q).Depth < i+1 {
			runtime.Gosched()
		}
	}
	require.NoError(t, q.Close(t.Context()))
	for i, p := range payloads {
		a := <-answers[i]
		if p == "poison" {
			require.ErrorIs(t, a.err, queue.ErrDeadLettered)
			require.ErrorIs(t, a.err, errPoison)
			continue
		}
		require.NoError(t, a.err)
		require.Equal(t, p, string(a.value))
	}
	d := <-dead
	require.Equal(t, "poison", string(d.Job.Payload))
	require.ErrorIs(t, d.Err, errPoison)
	require.Empty(t, dead, "only the poison job is dead-lettered")
	require.EqualValues(t, 1, stats(t, q).DeadLetters)
}

// A batch that fails on every delivery, as during a database outage: each
// job is delivered at most Retry's MaxAttempts times in all, the batch whole
// and then each job's last delivery alone, so the batch costs MaxAttempts−1+n
// handler calls before its jobs are dead-lettered, not MaxAttempts per job
// on top of the batch's.
func TestBatchOutageBounded(t *testing.T) {
	t.Parallel()
	const maxAttempts, n = 4, 6
	var (
		calls    atomic.Int64
		mu       sync.Mutex
		attempts = map[string][]int{} // payload → attempts delivered
	)
	q, err := queue.New(queue.Config{
		Partitions: 1,
		Retry:      contend.Retry{MaxAttempts: maxAttempts, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond},
		BatchHandler: func(_ context.Context, jobs []queue.Job) ([]queue.Result, error) {
			calls.Add(1)
			mu.Lock()
			defer mu.Unlock()
			for _, j := range jobs {
				attempts[string(j.Payload)] = append(attempts[string(j.Payload)], j.Attempt)
			}
			return nil, errPoison
		},
	})
	require.NoError(t, err)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := q.Submit(t.Context(), "k", []byte(strconv.Itoa(i)))
			errs <- err
		}()
		for stats(t, q).Depth < i+1 { // in order, and one batch once Close runs them
			runtime.Gosched()
		}
	}
	require.NoError(t, q.Close(t.Context()))
	for range n {
		err := <-errs
		require.ErrorIs(t, err, queue.ErrDeadLettered)
		require.ErrorIs(t, err, errPoison)
	}
	require.EqualValues(t, maxAttempts-1+n, calls.Load(), "handler calls")
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		require.Equal(t, []int{1, 2, 3, 4}, attempts[strconv.Itoa(i)], "job %d's deliveries", i)
	}
	require.EqualValues(t, n, stats(t, q).DeadLetters)
}

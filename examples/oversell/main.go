// Command oversell shows overselling, live: several server processes
// sell the last items of one product at once.
//
// First the naive way — read the stock, check it, write it back — with a
// sync.Mutex in each process: every process keeps its own goroutines apart and
// nothing else, so the processes sell more than there is. Then the same
// read-check-write under each strategy's guard (the same function body, passed
// to each Guard), the atomic conditional UPDATE, and a queue on Redis Streams
// that hands every purchase of the product to one consumer: none oversells.
//
//	go run ./examples/oversell [-processes 3] [-buyers 32] [-stock 200]
//
// It exits non-zero if any strategy but the naive one oversells, or if the
// naive one does not (the demonstration would then prove nothing).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/token"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/internal/workers"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// strategies, in the order they are shown.
var strategies = []string{"naive-mutex", "atomic", "pessimistic", "optimistic", "distlock", "queue"}

func main() {
	var (
		processes = flag.Int("processes", 3, "server processes selling at once")
		buyers    = flag.Int("buyers", 32, "concurrent buyers in each process")
		stock     = flag.Int64("stock", 200, "items in stock at the start")
	)
	flag.Parse()
	if isWorker() {
		os.Exit(workerMain())
	}
	ok, err := run(*processes, *buyers, *stock)
	if stopErr := testserver.StopAll(); err == nil {
		err = stopErr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "oversell:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// outcome is what one server process reports.
type outcome struct {
	Sold    int           `json:"sold"`
	SoldOut int           `json:"sold_out"`
	Errors  []string      `json:"errors"`
	Elapsed time.Duration `json:"elapsed"`
}

func run(processes, buyers int, stock int64) (ok bool, err error) {
	ctx := context.Background()
	redisURL, err := testserver.RedisURL()
	if err != nil {
		return false, err
	}
	url, drop, err := testserver.Schema(ctx)
	if err != nil {
		return false, err
	}
	defer func() { err = errors.Join(err, drop()) }()
	db, err := sqlx.Open("pgx", url)
	if err != nil {
		return false, err
	}
	defer db.Close()
	prefix := testserver.RandomName("contend:oversell:") + ":"

	fmt.Printf("%d server processes × %d buyers each, selling %d items of one product\n\n", processes, buyers, stock)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "strategy\tsold\tstock left\toversold\tsales/s\t")
	ok = true
	for _, s := range strategies {
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS products`); err != nil {
			return false, err
		}
		if err := workload.ProductsTable(ctx, db, stock, workload.Hot); err != nil {
			return false, err
		}
		// The optimistic guard's version lives on the row it guards; the
		// queue's handler records each purchase, so a redelivered job (the
		// queue delivers at least once) answers again without selling again.
		if _, err := db.ExecContext(ctx, `ALTER TABLE products ADD COLUMN version bigint NOT NULL DEFAULT 0;
			DROP TABLE IF EXISTS sales; CREATE TABLE sales (id text PRIMARY KEY, outcome text NOT NULL DEFAULT '')`); err != nil {
			return false, err
		}
		env := []string{"OVERSELL_POSTGRES=" + url, "OVERSELL_REDIS=" + redisURL, "OVERSELL_PREFIX=" + prefix + s + ":"}
		total, err := spawn(ctx, s, processes, buyers, env)
		if err != nil {
			return false, fmt.Errorf("%s: %w", s, err)
		}
		var left int64
		if err := db.GetContext(ctx, &left, `SELECT stock FROM products WHERE id = $1`, workload.Hot); err != nil {
			return false, err
		}
		// Sales the stock does not show: items sold twice.
		oversold := int64(total.Sold) - (stock - left)
		verdict := ""
		switch {
		case s == "naive-mutex" && oversold <= 0:
			verdict, ok = "  ← expected to oversell, and did not: the demonstration failed", false
		case s == "naive-mutex":
			verdict = "  ← each process's mutex kept only its own goroutines apart"
		case oversold != 0 || left < 0 || int64(total.Sold) > stock:
			verdict, ok = "  ← OVERSOLD", false
		case len(total.Errors) > 0:
			verdict, ok = "  ← errors: "+total.Errors[0], false
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%.0f\t%s\n", s, total.Sold, left, oversold,
			float64(total.Sold)/total.Elapsed.Seconds(), verdict)
	}
	w.Flush()
	if ok {
		fmt.Println("\nevery strategy sold exactly what there was; the naive one did not")
	}
	return ok, nil
}

// spawn runs processes server processes of strategy, starts them at once, and
// sums what they report.
func spawn(ctx context.Context, strategy string, processes, buyers int, env []string) (outcome, error) {
	env = append(env, workerEnv+"="+strategy, fmt.Sprintf("OVERSELL_BUYERS=%d", buyers))
	reports, err := workers.Spawn[outcome](ctx, processes, env)
	if err != nil {
		return outcome{}, err
	}
	var total outcome
	for _, o := range reports {
		total.Sold += o.Sold
		total.SoldOut += o.SoldOut
		total.Errors = append(total.Errors, o.Errors...)
		total.Elapsed = max(total.Elapsed, o.Elapsed)
	}
	return total, nil
}

// workerEnv names the strategy a re-executed copy of this program serves.
const workerEnv = "OVERSELL_WORKER"

func isWorker() bool { return os.Getenv(workerEnv) != "" }

// workerMain runs this process as a server process and returns its exit code.
func workerMain() int {
	var buyers int
	if _, err := fmt.Sscan(os.Getenv("OVERSELL_BUYERS"), &buyers); err != nil {
		fmt.Fprintln(os.Stderr, "oversell worker:", err)
		return 1
	}
	if err := serve(os.Getenv(workerEnv), buyers); err != nil {
		fmt.Fprintln(os.Stderr, "oversell worker:", err)
		return 1
	}
	return 0
}

// serve is one server process: its buyers keep buying until told "sold out".
func serve(strategy string, buyers int) error {
	ctx := context.Background()
	db, err := sqlx.Open("pgx", os.Getenv("OVERSELL_POSTGRES"))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	opts, err := redis.ParseURL(os.Getenv("OVERSELL_REDIS"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	buy, closeFn, err := buyer(strategy, db, rdb, os.Getenv("OVERSELL_PREFIX"))
	if err != nil {
		return err
	}
	defer closeFn()
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	if err := workers.Ready(os.Stdin, os.Stdout); err != nil {
		return err
	}
	// Each buyer keeps buying until it is told the product is sold out.
	var (
		mu  sync.Mutex // protects out
		out outcome
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range buyers {
		wg.Go(func() {
			var sold int
			var failure error
			for {
				err := buy(ctx, workload.Hot)
				if err == nil {
					sold++
					continue
				}
				if !errors.Is(err, contend.ErrConflict) {
					failure = err
				}
				break
			}
			mu.Lock()
			defer mu.Unlock()
			out.Sold += sold
			out.SoldOut++
			if failure != nil {
				out.Errors = append(out.Errors, failure.Error())
			}
		})
	}
	wg.Wait()
	out.Elapsed = time.Since(start)
	return workers.Report(os.Stdout, out)
}

// buyer returns strategy's buy operation and what closes it.
func buyer(strategy string, db *sqlx.DB, rdb *redis.Client, prefix string) (func(context.Context, string) error, func(), error) {
	nothing := func() {}
	switch strategy {
	case "naive-mutex":
		return workload.Guarded(&workload.MutexGuard{}, workload.Sell(db)), nothing, nil
	case "atomic":
		return func(ctx context.Context, key string) error {
			sold, err := atomic.Update(ctx, db, `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, key)
			if err == nil && !sold {
				err = workload.ErrSoldOut
			}
			return err
		}, nothing, nil
	case "pessimistic":
		l, err := pessimistic.New(db, pessimistic.Config{Table: "products"})
		return workload.Guarded(l, workload.Sell(db)), nothing, err
	case "optimistic":
		g, err := optimistic.NewGuard(db, optimistic.Config{Table: "products", Retry: contend.Retry{MaxAttempts: 1000}})
		return workload.Guarded(g, workload.Sell(db)), nothing, err
	case "distlock":
		c, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix})
		if err != nil {
			return nil, nil, err
		}
		return workload.Guarded(c, workload.Sell(db)), func() { c.Close(context.Background()) }, nil
	case "queue":
		return queued(db, rdb, prefix)
	}
	return nil, nil, fmt.Errorf("unknown strategy %q", strategy)
}

// queued sells through a queue on Redis Streams shared by every process:
// each purchase is a job on the product's partition, which one process at a
// time consumes, so purchases of one product never race. The handler records
// each purchase by its id in the same transaction as the sale, because the
// queue delivers at least once: a job redelivered after an owner died answers
// what it answered before instead of selling again.
func queued(db *sqlx.DB, rdb *redis.Client, prefix string) (func(context.Context, string) error, func(), error) {
	handle := func(ctx context.Context, job queue.Job) ([]byte, error) {
		var outcome string
		_, err := txn.Run(ctx, db, txn.Options{}, func(ctx context.Context, tx contend.DBTX) error {
			res, err := tx.ExecContext(ctx, `INSERT INTO sales (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`, string(job.Payload))
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return tx.QueryRowContext(ctx, `SELECT outcome FROM sales WHERE id = $1`, string(job.Payload)).Scan(&outcome)
			}
			sold, err := atomic.Update(ctx, tx, `UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock >= 1`, job.Key)
			if err != nil {
				return err
			}
			outcome = map[bool]string{true: "sold", false: "sold out"}[sold]
			_, err = tx.ExecContext(ctx, `UPDATE sales SET outcome = $2 WHERE id = $1`, string(job.Payload), outcome)
			return err
		})
		return []byte(outcome), err
	}
	q, err := redisq.New(redisq.Config{Redis: rdb, Prefix: prefix, Partitions: 4, Handler: handle})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = q.Run(ctx)
	}()
	stop := func() {
		_ = q.Close(context.Background())
		cancel()
		<-done
	}
	return func(ctx context.Context, key string) error {
		answer, err := q.Submit(ctx, key, []byte(token.New()))
		switch {
		case err != nil:
			return err
		case string(answer) == "sold out":
			return workload.ErrSoldOut
		}
		return nil
	}, stop, nil
}

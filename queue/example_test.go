package queue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend/atomic"
	"github.com/contend/contend/queue"
)

// Submit waits for the job's result: request/reply through the key's
// partition worker.
func ExampleQueue_Submit() {
	q, err := queue.New(queue.Config{
		Partitions: 4,
		Handler: func(_ context.Context, job queue.Job) ([]byte, error) {
			return []byte(strings.ToUpper(string(job.Payload))), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go q.Run(ctx)
	defer q.Close(ctx)

	got, err := q.Submit(ctx, "greeting", []byte("hello"))
	fmt.Println(string(got), err)
	// Output: HELLO <nil>
}

// Stats counts what the partitions hold and did, per partition and summed:
// here three jobs enqueued before Run, two of them on one key's partition,
// and then the same three handled.
func ExampleQueue_Stats() {
	q, err := queue.New(queue.Config{Partitions: 4, Handler: func(context.Context, queue.Job) ([]byte, error) {
		return nil, nil
	}})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"sku-1", "sku-1", "sku-2"} {
		if err := q.Enqueue(ctx, key, nil); err != nil {
			log.Fatal(err)
		}
	}
	s, err := q.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting:", s.Depth, "sku-1's partition:", s.Partitions[q.Partition("sku-1")].Depth)

	// Close runs the accepted jobs before it returns.
	if err := q.Close(ctx); err != nil {
		log.Fatal(err)
	}
	s, err = q.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting:", s.Depth, "handled:", s.Handled)
	// Output:
	// waiting: 3 sku-1's partition: 2
	// waiting: 0 handled: 3
}

// Do makes the queue a Guard for this process: fns of one key run one at a
// time on its partition worker, so an unguarded read-modify-write is safe.
func ExampleQueue_Do() {
	// Do runs fns, not jobs: the handler answers Submit only.
	noJobs := func(context.Context, queue.Job) ([]byte, error) { return nil, nil }
	q, err := queue.New(queue.Config{Partitions: 8, Handler: noJobs})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go q.Run(ctx)
	defer q.Close(ctx)

	counter := map[string]int{} // touched only by key "hits"'s worker
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			_ = q.Do(ctx, "hits", func(context.Context) error {
				counter["hits"]++
				return nil
			})
		})
	}
	wg.Wait()
	_ = q.Do(ctx, "hits", func(context.Context) error {
		fmt.Println("hits:", counter["hits"])
		return nil
	})
	// Output: hits: 100
}

// The hot-key fix: 5 buyers, 3 in stock. A batch handler sells a batch's
// pending buys of a product with one UPDATE and answers each buyer, in
// submit order.
func Example_hotKey() {
	db, done := exampleDB(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL CHECK (stock >= 0));
		INSERT INTO products VALUES ('sku-1', 3)`)
	defer done()
	ctx := context.Background()

	q, err := queue.New(queue.Config{
		Partitions: 4,
		BatchHandler: func(ctx context.Context, jobs []queue.Job) ([]queue.Result, error) {
			// Every job of this example is for sku-1; see sell_test.go for
			// batches of several products.
			var sold int
			err := db.QueryRowContext(ctx, `UPDATE products p SET stock = p.stock - least(old.stock, $2)
				FROM (SELECT stock FROM products WHERE id = $1 FOR UPDATE) old
				WHERE p.id = $1 RETURNING old.stock - p.stock`, jobs[0].Key, len(jobs)).Scan(&sold)
			if err != nil {
				return nil, err
			}
			results := make([]queue.Result, len(jobs))
			for i := range jobs {
				results[i].Value = []byte("sold out")
				if i < sold {
					results[i].Value = []byte("sold")
				}
			}
			return results, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Buy before Run, so that all five wait in one batch.
	var answers []<-chan string
	for range 5 {
		answers = append(answers, submit(ctx, q, "sku-1"))
	}
	go q.Run(ctx)
	defer q.Close(ctx)
	for _, a := range answers {
		fmt.Println(<-a)
	}
	var stock int
	_ = db.Get(&stock, `SELECT stock FROM products WHERE id = 'sku-1'`)
	fmt.Println("stock:", stock)
	// Output:
	// sold
	// sold
	// sold
	// sold out
	// sold out
	// stock: 0
}

// submit submits a buy and returns a channel with its answer, once the job is
// in the buffer: the buys keep their order.
func submit(ctx context.Context, q *queue.Queue, key string) <-chan string {
	answer := make(chan string, 1)
	depth := waiting(ctx, q)
	go func() {
		v, err := q.Submit(ctx, key, nil)
		if err != nil {
			answer <- err.Error()
			return
		}
		answer <- string(v)
	}()
	for waiting(ctx, q) == depth {
		// The queue is not running yet: the depth grows when the job is in.
		runtime.Gosched()
	}
	return answer
}

// waiting returns how many jobs wait in q.
func waiting(ctx context.Context, q *queue.Queue) int {
	s, err := q.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return s.Depth
}

// An idempotent handler: the job id and the effect are written by one
// statement, which does nothing when the id was seen before, so a job
// delivered twice (a retry after a failure that came after the write, or a
// redelivery by an at-least-once backend) sells once.
func Example_idempotent() {
	db, done := exampleDB(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL);
		CREATE TABLE processed_jobs (job_id text PRIMARY KEY);
		INSERT INTO products VALUES ('sku-1', 10)`)
	defer done()
	ctx := context.Background()

	q, err := queue.New(queue.Config{
		Partitions: 4,
		Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
			applied, err := atomic.Update(ctx, db, `
				WITH first AS (INSERT INTO processed_jobs (job_id) VALUES ($2) ON CONFLICT DO NOTHING RETURNING 1)
				UPDATE products SET stock = stock - 1
				WHERE id = $1 AND stock >= 1 AND EXISTS (SELECT 1 FROM first)`,
				job.Key, string(job.Payload))
			if err != nil {
				return nil, err
			}
			return fmt.Appendf(nil, "applied=%t", applied), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go q.Run(ctx)
	defer q.Close(ctx)

	for range 2 { // the same job, delivered twice
		got, err := q.Submit(ctx, "sku-1", []byte("order-42"))
		fmt.Println(string(got), err)
	}
	var stock int
	_ = db.Get(&stock, `SELECT stock FROM products WHERE id = 'sku-1'`)
	fmt.Println("stock:", stock)
	// Output:
	// applied=true <nil>
	// applied=false <nil>
	// stock: 9
}

// Typed puts request and response types on the byte payloads (JSON by
// default).
func ExampleTyped() {
	type Buy struct{ Qty int }
	type Answer struct {
		Sold bool
		Left int
	}
	var (
		buys  queue.Typed[Buy, Answer]
		stock = map[string]int{"sku-1": 3} // touched only by the key's worker
	)
	q, err := queue.New(queue.Config{
		Partitions: 4,
		Handler: buys.Handler(func(_ context.Context, key string, b Buy) (Answer, error) {
			if stock[key] < b.Qty {
				return Answer{Left: stock[key]}, nil
			}
			stock[key] -= b.Qty
			return Answer{Sold: true, Left: stock[key]}, nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go q.Run(ctx)
	defer q.Close(ctx)

	for _, qty := range []int{2, 2, 1} {
		a, err := buys.Submit(ctx, q, "sku-1", Buy{Qty: qty})
		fmt.Printf("%+v %v\n", a, err)
	}
	// Output:
	// {Sold:true Left:1} <nil>
	// {Sold:false Left:1} <nil>
	// {Sold:true Left:0} <nil>
}

// exampleDB opens a pool on the PostgreSQL server named by
// CONTEND_POSTGRES_URL (default: the local one, database test), in a schema
// of its own so that examples running at once never share a table, runs setup
// there, and returns the pool with a function that drops the schema.
func exampleDB(setup string) (*sqlx.DB, func()) {
	server := os.Getenv("CONTEND_POSTGRES_URL")
	if server == "" {
		server = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	admin := sqlx.MustOpen("pgx", server)
	admin.MustExec("CREATE SCHEMA " + schema)
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema) // sent to the server as a run-time setting
	u.RawQuery = q.Encode()
	db := sqlx.MustOpen("pgx", u.String())
	db.MustExec(setup)
	return db, func() {
		db.Close()
		admin.MustExec("DROP SCHEMA " + schema + " CASCADE")
		admin.Close()
	}
}

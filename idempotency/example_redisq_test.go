package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// A queue delivers a job at least once: a worker that dies after its work
// and before the job's acknowledgement has it delivered again. With the
// order's id as the key, the second delivery replays the first one's
// answer instead of shipping twice.
func ExampleStore_Do_redisq() {
	db, done := exampleDB(exampleTables + `; CREATE TABLE shipments (order_id text NOT NULL)`)
	defer done()
	client, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()
	store, err := idempotency.New(db, idempotency.Config{Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}

	ship := func(ctx context.Context, job queue.Job) ([]byte, error) {
		order := string(job.Payload)
		answer, replayed, err := store.Do(ctx, "ship:"+order, "ship", func(ctx context.Context) ([]byte, error) {
			_, err := contend.Querier(ctx, db).ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, order)
			return []byte("shipped " + order), err
		})
		if err != nil {
			return nil, err
		}
		if job.Attempt == 1 {
			return nil, errors.New("the worker died before the ack") // as if: the job comes again
		}
		return fmt.Appendf(answer, " (delivery %d, replayed %t)", job.Attempt, replayed), nil
	}
	q, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 2, Handler: ship})
	if err != nil {
		log.Fatal(err)
	}
	go q.Run(ctx)
	defer q.Close(ctx)

	answer, err := q.Submit(ctx, "order-42", []byte("order-42"))
	fmt.Println(string(answer), err)
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM shipments`); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipments:", n)
	// Output:
	// shipped order-42 (delivery 2, replayed true) <nil>
	// shipments: 1
}

// exampleRedis returns a client and a key prefix of its own, and the
// function that deletes the prefix's keys and closes the client.
func exampleRedis() (*redis.Client, string, func()) {
	addr := os.Getenv("CONTEND_REDIS_URL")
	if addr == "" {
		addr = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(addr)
	if err != nil {
		log.Fatal(err)
	}
	client := redis.NewClient(opts)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "example:" + hex.EncodeToString(b[:]) + ":"
	return client, prefix, func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			log.Print(err)
		}
		client.Close()
	}
}

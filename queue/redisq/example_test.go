package redisq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// Two instances share the streams: one consumes, the other only submits and
// gets the answer back through Redis.
func Example() {
	client, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()

	consumer, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 4,
		Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
			fence, _ := redisq.Fence(ctx) // pass it to the database write
			return fmt.Appendf(nil, "%s handled under a lease (fence > 0: %t)", job.Payload, fence > 0), nil
		}})
	if err != nil {
		log.Fatal(err)
	}
	go consumer.Run(ctx)
	defer consumer.Close(ctx)

	producer, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close(ctx)
	answer, err := producer.Submit(ctx, "sku-1", []byte("buy"))
	fmt.Println(string(answer), err)
	// Output: buy handled under a lease (fence > 0: true) <nil>
}

// Stats counts what this instance did; Depth, read from Redis, is what every
// instance sees: here three jobs no consumer has taken yet.
func ExampleQueue_Stats() {
	client, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()

	producer, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close(ctx)
	for _, key := range []string{"sku-1", "sku-1", "sku-2"} {
		if err := producer.Enqueue(ctx, key, nil); err != nil {
			log.Fatal(err)
		}
	}
	s, err := producer.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting:", s.Depth, "sku-1's partition:", s.Partitions[producer.Partition("sku-1")].Depth, "handled here:", s.Handled)
	// Output: waiting: 3 sku-1's partition: 2 handled here: 0
}

// Dead letters can be worked through from any instance: listed with their
// error, requeued once the handler is fixed, or deleted. Here the consumer
// refuses a format it does not know yet, and an operator's instance takes
// over.
func ExampleQueue_DeadLetters() {
	client, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()

	var fixed atomic.Bool // the handler's fix is deployed
	handled := make(chan string, 1)
	consumer, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 4,
		Retry: contend.Retry{MaxAttempts: 2},
		Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
			if string(job.Payload) == "v2" && !fixed.Load() {
				return nil, errors.New("unknown format v2")
			}
			handled <- job.Key + " " + string(job.Payload)
			return nil, nil
		}})
	if err != nil {
		log.Fatal(err)
	}
	go consumer.Run(ctx)
	defer consumer.Close(ctx)

	operator, err := redisq.New(client, redisq.Config{Prefix: prefix, Partitions: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer operator.Close(ctx)
	for _, key := range []string{"order-1", "order-2"} {
		_, err := operator.Submit(ctx, key, []byte("v2"))
		fmt.Println(key, errors.Is(err, redisq.ErrRemote))
	}

	// Every partition's dead letters, a page at a time.
	const page = 100
	var letters []queue.DeadLetter
	for p := range 4 {
		for after := ""; ; {
			some, err := operator.DeadLetters(ctx, p, after, page)
			if err != nil {
				log.Fatal(err)
			}
			letters = append(letters, some...)
			if len(some) < page {
				break
			}
			after = some[len(some)-1].ID
		}
	}
	slices.SortFunc(letters, func(a, b queue.DeadLetter) int { return strings.Compare(a.Job.Key, b.Job.Key) })
	for _, l := range letters {
		fmt.Printf("%s %s: %d deliveries, %v\n", l.Job.Key, l.Job.Payload, l.Job.Attempt, l.Err)
	}

	fixed.Store(true)
	retry, drop := letters[0], letters[1]
	n, err := operator.RequeueDeadLetters(ctx, operator.Partition(retry.Job.Key), retry.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", n, "handled:", <-handled)
	n, err = operator.DeleteDeadLetters(ctx, operator.Partition(drop.Job.Key), drop.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", n)
	// Output:
	// order-1 true
	// order-2 true
	// order-1 v2: 2 deliveries, redisq: handler failed: unknown format v2
	// order-2 v2: 2 deliveries, redisq: handler failed: unknown format v2
	// requeued: 1 handled: order-1 v2
	// deleted: 1
}

// exampleRedis returns a client of the Redis server named by
// CONTEND_REDIS_URL (default: the local one), a key prefix no other run
// uses, and a function that deletes the prefix's keys and closes the client.
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

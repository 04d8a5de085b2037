package redisq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// Two instances share the streams: one consumes, the other only submits and
// gets the answer back through Redis.
func Example() {
	client, prefix, done := exampleRedis()
	defer done()
	ctx := context.Background()

	consumer, err := redisq.New(redisq.Config{Redis: client, Prefix: prefix, Partitions: 4,
		Handler: func(ctx context.Context, job queue.Job) ([]byte, error) {
			fence, _ := redisq.Fence(ctx) // pass it to the database write
			return fmt.Appendf(nil, "%s handled under a lease (fence > 0: %t)", job.Payload, fence > 0), nil
		}})
	if err != nil {
		log.Fatal(err)
	}
	go consumer.Run(ctx)
	defer consumer.Close(ctx)

	producer, err := redisq.New(redisq.Config{Redis: client, Prefix: prefix, Partitions: 4})
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

	producer, err := redisq.New(redisq.Config{Redis: client, Prefix: prefix, Partitions: 4})
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

// exampleRedis returns a client of the test server, a key prefix of its
// own, and what closes the client and deletes the keys.
func exampleRedis() (*redis.Client, string, func()) {
	url, err := testserver.RedisURL()
	if err != nil {
		log.Fatal(err)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		log.Fatal(err)
	}
	client := redis.NewClient(opts)
	prefix := testserver.RandomName("example:") + ":"
	return client, prefix, func() {
		_ = testserver.DeletePrefix(context.Background(), client, prefix)
		client.Close()
	}
}

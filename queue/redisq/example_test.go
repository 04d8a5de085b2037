package redisq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

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

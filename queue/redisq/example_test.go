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
	url, err := testserver.RedisURL()
	if err != nil {
		log.Fatal(err)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		log.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	prefix := testserver.RandomName("example:") + ":"
	ctx := context.Background()
	defer testserver.DeletePrefix(ctx, client, prefix)

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

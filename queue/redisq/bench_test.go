package redisq_test

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// BenchmarkThroughput pairs the queue with `raw`: go-redis XADD by producers
// and, per partition, XREADGROUP of up to 100 entries and one XACK for them,
// the least a consumer group can do. The queue reads the same way and gives
// the entries to a batch handler that does nothing; it also trims the stream
// and checks its lease. The time includes draining every job.

const benchPartitions = 16

func BenchmarkThroughput(b *testing.B) {
	keys := workload.Keys("k", 1000)
	pick := func() string { return keys[rand.IntN(len(keys))] }
	for _, impl := range []struct {
		name string
		run  func(b *testing.B, client *redis.Client, prefix string, workers int, pick func() string)
	}{
		{"raw", rawRedis},
		{"queue", queueRedis},
	} {
		b.Run(impl.name+"/redis/partitions="+strconv.Itoa(benchPartitions)+"/spread", func(b *testing.B) {
			for _, workers := range []int{1, 8, 64} {
				b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
					client, prefix := testserver.Redis(b)
					impl.run(b, client, prefix, workers, pick)
				})
			}
		})
	}
}

func rawRedis(b *testing.B, client *redis.Client, prefix string, workers int, pick func() string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		handled atomic.Int64
		wg      sync.WaitGroup
		all     = make(chan struct{})
		target  atomic.Int64
	)
	target.Store(-1)
	stream := func(p int) string { return prefix + "{" + strconv.Itoa(p) + "}" }
	for p := range benchPartitions {
		if err := client.XGroupCreateMkStream(ctx, stream(p), "workers", "$").Err(); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
					Group: "workers", Consumer: "c", Streams: []string{stream(p), ">"}, Count: 100, Block: 200 * time.Millisecond,
				}).Result()
				if err != nil {
					continue
				}
				ids := make([]string, len(res[0].Messages))
				for i, m := range res[0].Messages {
					ids[i] = m.ID
				}
				if err := client.XAck(ctx, stream(p), "workers", ids...).Err(); err != nil {
					continue
				}
				if n := handled.Add(int64(len(ids))); n == target.Load() {
					close(all)
				}
			}
		})
	}
	workload.Parallel(b, workers, func(ctx context.Context) error {
		k := pick()
		return client.XAdd(ctx, &redis.XAddArgs{Stream: stream(int(fnv1a(k) % benchPartitions)), Values: []any{"key", k, "payload", ""}}).Err()
	})
	waitAll(b, &handled, &target, all)
	cancel()
	wg.Wait()
}

func queueRedis(b *testing.B, client *redis.Client, prefix string, workers int, pick func() string) {
	var (
		handled atomic.Int64
		target  atomic.Int64
		all     = make(chan struct{})
	)
	target.Store(-1)
	consumer := instance(b, client, prefix, redisq.Config{Partitions: benchPartitions, BatchHandler: func(_ context.Context, jobs []queue.Job) ([]queue.Result, error) {
		if n := handled.Add(int64(len(jobs))); n == target.Load() {
			close(all)
		}
		return make([]queue.Result, len(jobs)), nil
	}})
	_ = consumer
	producer := instance(b, client, prefix, redisq.Config{Partitions: benchPartitions})
	workload.Parallel(b, workers, func(ctx context.Context) error {
		return producer.Enqueue(ctx, pick(), nil)
	})
	waitAll(b, &handled, &target, all)
}

// waitAll waits until the consumers have handled every job the benchmark
// produced.
func waitAll(b *testing.B, handled, target *atomic.Int64, all chan struct{}) {
	n := int64(b.N)
	target.Store(n)
	if handled.Load() >= n {
		return // the last batch came in before the target was set
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatal(errors.New("consumers did not drain"))
	}
}

func fnv1a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

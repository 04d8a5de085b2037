package redisq_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// keysUnder returns every key under prefix, on every master of a Cluster.
func keysUnder(t testing.TB, client redis.UniversalClient, prefix string) []string {
	t.Helper()
	c, ok := client.(*redis.ClusterClient)
	if !ok {
		keys, err := client.Keys(t.Context(), prefix+"*").Result()
		require.NoError(t, err)
		return keys
	}
	var all []string
	ch := make(chan []string, 16)
	require.NoError(t, c.ForEachMaster(t.Context(), func(ctx context.Context, node *redis.Client) error {
		keys, err := node.Keys(ctx, prefix+"*").Result()
		ch <- keys
		return err
	}))
	close(ch)
	for keys := range ch {
		all = append(all, keys...)
	}
	return all
}

// What a queue leaves in Redis after a run in which jobs were submitted,
// dead-lettered, and left behind by an instance that died: the partitions'
// streams, holding no consumer and at most the last entry, and their
// dead-letter streams, within their limit; every other key expires by
// itself.
func testKeysLeft(t *testing.T, client redis.UniversalClient, prefix string) {
	const partitions, limit, poisoned = 2, 10, 150
	handler := func(_ context.Context, job queue.Job) ([]byte, error) {
		if job.Key == "poison" {
			return nil, errPoison
		}
		return job.Payload, nil
	}
	cfg := redisq.Config{Partitions: partitions, Handler: handler, DeadLetterLimit: limit, Retry: contend.Retry{MaxAttempts: 1}}
	producer := instance(t, client, prefix, redisq.Config{Partitions: partitions})
	// An instance that read two entries and died before acknowledging them.
	for i := range 2 {
		require.NoError(t, producer.Enqueue(t.Context(), "k", []byte(strconv.Itoa(i))))
	}
	stream := prefix + "{" + strconv.Itoa(producer.Partition("k")) + "}"
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "workers", "0").Err())
	require.NoError(t, client.XReadGroup(t.Context(), &redis.XReadGroupArgs{
		Group: "workers", Consumer: "dead", Streams: []string{stream, ">"}, Count: 2,
	}).Err())

	a := instance(t, client, prefix, cfg)
	b := instance(t, client, prefix, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		_, err := producer.Submit(ctx, "key-"+strconv.Itoa(i), nil)
		require.NoError(t, err)
	}
	for range poisoned {
		require.NoError(t, producer.Enqueue(ctx, "poison", nil))
	}
	_, err := producer.Submit(ctx, "poison", nil)
	require.ErrorIs(t, err, redisq.ErrRemote)
	waitDepth(t, producer, 0)
	// A consumer that appears after the owners' last reclaim, as an earlier
	// owner's read that reached Redis late would make, or its own deletion
	// that timed out would leave: only the instances' leaving deletes it.
	for p := range partitions {
		require.NoError(t, client.XGroupCreateConsumer(ctx, prefix+"{"+strconv.Itoa(p)+"}", "workers", "late").Err())
	}
	for _, q := range []*redisq.Queue{a, b, producer} {
		require.NoError(t, q.Close(ctx))
	}

	for _, key := range keysUnder(t, client, prefix) {
		rest := strings.TrimPrefix(key, prefix)
		switch {
		case strings.HasSuffix(rest, "}:dead"):
			n, err := client.XLen(ctx, key).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, n, int64(limit+100), "%s holds %d dead letters, past its limit", rest, n)
		case strings.HasPrefix(rest, "{") && strings.HasSuffix(rest, "}"):
			n, err := client.XLen(ctx, key).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, n, int64(1), "%s holds done entries", rest)
			consumers, err := client.XInfoConsumers(ctx, key, "workers").Result()
			require.NoError(t, err)
			require.Empty(t, consumers, "%s keeps the consumers of instances that are gone", rest)
		default:
			ttl, err := client.PTTL(ctx, key).Result()
			require.NoError(t, err)
			require.Positive(t, ttl, "%s never expires", rest)
		}
	}
}

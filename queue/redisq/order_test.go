package redisq_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/queue"
)

// The order tests have producers enqueue "producer:seq" jobs, seq counting
// from 1 per producer and key, and a handler that appends
// "producer:seq@consumer" to the key's log in Redis.

func logOf(prefix, key string) string { return prefix + "log:" + key }

// record is the handler of the order tests, on the instance called consumer.
func record(client redis.UniversalClient, prefix, consumer string) queue.Handler {
	return func(ctx context.Context, job queue.Job) ([]byte, error) {
		return nil, client.RPush(ctx, logOf(prefix, job.Key), string(job.Payload)+"@"+consumer).Err()
	}
}

// requireKeyOrder checks key's log: each producer's jobs were handled in the
// order it enqueued them, a job at most repeated right after itself (a
// redelivery after a hand-over: delivery is at least once). It returns the
// last sequence number handled per producer and the jobs handled per
// consumer.
func requireKeyOrder(t testing.TB, client redis.UniversalClient, prefix, key string) (last, consumers map[string]int) {
	t.Helper()
	entries, err := client.LRange(t.Context(), logOf(prefix, key), 0, -1).Result()
	require.NoError(t, err)
	last, consumers = map[string]int{}, map[string]int{}
	for _, e := range entries {
		job, consumer, ok := strings.Cut(e, "@")
		require.True(t, ok, e)
		consumers[consumer]++
		producer, n, ok := strings.Cut(job, ":")
		require.True(t, ok, e)
		seq, err := strconv.Atoi(n)
		require.NoError(t, err)
		if seq == last[producer] {
			continue // a redelivery right after a hand-over
		}
		require.Equal(t, last[producer]+1, seq, "key %s: producer %s's job %d handled after job %d", key, producer, seq, last[producer])
		last[producer] = seq
	}
	return last, consumers
}

// handledLen is how many jobs the order tests' handlers logged for keys,
// repeats included.
func handledLen(t testing.TB, client redis.UniversalClient, prefix string, keys []string) int {
	n := 0
	for _, k := range keys {
		n += int(client.LLen(t.Context(), logOf(prefix, k)).Val())
	}
	return n
}

// handledJobs is how many distinct jobs the order tests' handlers logged for
// keys: a redelivered job counts once, so a redelivery cannot make up for a
// job still pending.
func handledJobs(t testing.TB, client redis.UniversalClient, prefix string, keys []string) int {
	n := 0
	for _, k := range keys {
		entries, err := client.LRange(t.Context(), logOf(prefix, k), 0, -1).Result()
		require.NoError(t, err)
		jobs := map[string]bool{}
		for _, e := range entries {
			job, _, _ := strings.Cut(e, "@")
			jobs[job] = true
		}
		n += len(jobs)
	}
	return n
}

package redisq_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/queue"
	"github.com/contend/contend/queue/redisq"
)

// Three OS processes, each producing and consuming: every process enqueues
// jobs for each key in its own order, and the jobs of one key must be
// handled in that order, whichever process holds the key's partition at the
// time. Processes join, take partitions and leave (handing their partitions
// and their unacknowledged jobs over) during the run; the test process
// drains what is left. Delivery is at least once, so a job may be handled
// twice in a row after a hand-over, never out of order.
func TestOrderPerKeyAcrossProcesses(t *testing.T) {
	const (
		processes = 3
		keys      = 6
		perKey    = 15
	)
	var (
		client *redis.Client
		prefix string
	)
	ks := make([]string, keys)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i)
	}
	logOf := func(prefix, key string) string { return prefix + "log:" + key }
	record := func(client *redis.Client, prefix string) queue.Handler {
		return func(ctx context.Context, job queue.Job) ([]byte, error) {
			entry := fmt.Sprintf("%s@%d", job.Payload, os.Getpid())
			return nil, client.RPush(ctx, logOf(prefix, job.Key), entry).Err()
		}
	}
	harness.Run(t, harness.Config{Processes: processes, Goroutines: 1, Ops: keys * perKey, Keys: ks},
		func() harness.Params {
			client, prefix = testserver.Redis(t)
			return harness.Params{"prefix": prefix}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			client, _ := testserver.Redis(t)
			q := instance(t, client, p["prefix"], redisq.Config{Handler: record(client, p["prefix"])})
			var (
				mu  sync.Mutex
				seq = map[string]int{}
			)
			pid := os.Getpid()
			return func(ctx context.Context, key string) error {
				mu.Lock()
				seq[key]++
				n := seq[key]
				mu.Unlock()
				return q.Enqueue(ctx, key, fmt.Appendf(nil, "%d:%d", pid, n))
			}
		})

	// The workers are gone; whatever they left pending, this process takes
	// over once their leases expire, and handles first.
	instance(t, client, prefix, redisq.Config{Handler: record(client, prefix)})
	handled := func() int {
		n := 0
		for _, k := range ks {
			n += int(client.LLen(t.Context(), logOf(prefix, k)).Val())
		}
		return n
	}
	require.Eventually(t, func() bool { return handled() >= processes*keys*perKey }, 30*time.Second, 20*time.Millisecond,
		"only %d of %d jobs were handled", handled(), processes*keys*perKey)

	consumers := map[string]int{} // consumer pid → jobs handled
	for _, k := range ks {
		entries, err := client.LRange(t.Context(), logOf(prefix, k), 0, -1).Result()
		require.NoError(t, err)
		last := map[string]int{} // producer pid → last sequence number handled
		for _, e := range entries {
			job, consumer, ok := strings.Cut(e, "@")
			require.True(t, ok, e)
			consumers[consumer]++
			pid, n, ok := strings.Cut(job, ":")
			require.True(t, ok, e)
			seq, err := strconv.Atoi(n)
			require.NoError(t, err)
			if seq == last[pid] {
				continue // a redelivery right after a hand-over
			}
			require.Equal(t, last[pid]+1, seq, "key %s: producer %s's job %d handled after job %d", k, pid, seq, last[pid])
			last[pid] = seq
		}
		require.Len(t, last, processes, "key %s: jobs of every producer were handled", k)
		for pid, n := range last {
			require.Equal(t, perKey, n, "key %s: producer %s's jobs all handled", k, pid)
		}
	}
	t.Logf("jobs handled per consumer process: %v", consumers)
	require.GreaterOrEqual(t, len(consumers), 2, "the jobs must have crossed processes for the order to mean anything")
}

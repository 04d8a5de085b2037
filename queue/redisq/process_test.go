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
	"github.com/contend/contend/queue/redisq"
)

// Three OS processes, each producing and consuming: every process enqueues
// jobs for each key in its own order, and the jobs of one key must be
// handled in that order, whichever process holds the key's partition at the
// time. Processes join, take partitions and leave (handing their partitions
// and their unacknowledged jobs over) during the run; the test process
// drains what is left. Delivery is at least once, so a job may be handled
// twice in a row after a hand-over, never out of order.
//
// It runs on one Redis node here, and on a Redis Cluster in TestCluster.
func TestOrderPerKeyAcrossProcesses(t *testing.T) { orderAcrossProcesses(t, oneNode) }

// A deployment is where a test across processes runs. It is called in the
// test process only, and returns a client and the params that tell the
// workers where Redis is and which prefix to use ([workerRedis] reads
// them).
type deployment func(t *testing.T) (redis.UniversalClient, harness.Params)

// oneNode is the deployment of one Redis node, the test server.
func oneNode(t *testing.T) (redis.UniversalClient, harness.Params) {
	client, prefix := testserver.Redis(t)
	return client, harness.Params{"prefix": prefix}
}

// workerRedis returns, in a worker process, a client of the Redis that a
// deployment's params name, closed when t ends.
func workerRedis(t testing.TB, p harness.Params) redis.UniversalClient {
	addrs := p["cluster"]
	if addrs == "" {
		client, _ := testserver.Redis(t)
		return client
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	t.Cleanup(func() { c.Close() })
	return c
}

// orderAcrossProcesses runs the test above on the deployment setup makes.
func orderAcrossProcesses(t *testing.T, setup deployment) {
	const (
		processes = 3
		keys      = 6
		perKey    = 15
	)
	var (
		client redis.UniversalClient
		prefix string
	)
	ks := make([]string, keys)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i)
	}
	harness.Run(t, harness.Config{Processes: processes, Goroutines: 1, Ops: keys * perKey, Keys: ks},
		func() harness.Params {
			var p harness.Params
			client, p = setup(t)
			prefix = p["prefix"]
			return p
		},
		func(t testing.TB, p harness.Params) harness.Op {
			client := workerRedis(t, p)
			pid := strconv.Itoa(os.Getpid())
			q := instance(t, client, p["prefix"], redisq.Config{Handler: record(client, p["prefix"], pid)})
			var (
				mu  sync.Mutex
				seq = map[string]int{}
			)
			return func(ctx context.Context, key string) error {
				mu.Lock()
				seq[key]++
				n := seq[key]
				mu.Unlock()
				return q.Enqueue(ctx, key, fmt.Appendf(nil, "%s:%d", pid, n))
			}
		})

	// The workers are gone; whatever they left pending, this process takes
	// over once their leases expire, and handles first.
	instance(t, client, prefix, redisq.Config{Handler: record(client, prefix, strconv.Itoa(os.Getpid()))})
	// Distinct jobs: under load a lease can pass mid-job, and the job's
	// redelivery must not count for one still pending.
	handled := func() int { return handledJobs(t, client, prefix, ks) }
	require.Eventually(t, func() bool { return handled() >= processes*keys*perKey }, 30*time.Second, 20*time.Millisecond,
		"only %d of %d jobs were handled", handled(), processes*keys*perKey)

	consumers := map[string]int{} // consumer pid → jobs handled
	for _, k := range ks {
		last, byConsumer := requireKeyOrder(t, client, prefix, k)
		for c, n := range byConsumer {
			consumers[c] += n
		}
		require.Len(t, last, processes, "key %s: jobs of every producer were handled", k)
		for pid, n := range last {
			require.Equal(t, perKey, n, "key %s: producer %s's jobs all handled", k, pid)
		}
	}
	t.Logf("jobs handled per consumer process: %v", consumers)
	require.GreaterOrEqual(t, len(consumers), 2, "the jobs must have crossed processes for the order to mean anything")
}

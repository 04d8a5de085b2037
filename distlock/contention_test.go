package distlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// load is 64 goroutines in each of 3 processes on one key, 384 holds in all:
// each is handed over while up to 191 others wait, the first as the last.
var load = harness.Config{Processes: 3, Goroutines: 64, Ops: 2, Keys: []string{"hot"}}

// readThenWrite is the critical section: it records the holder's fencing
// token in the order holders entered and increments a counter by reading it
// and writing it back, a window in which an overlapping holder's increment
// is lost.
func readThenWrite(ctx context.Context, rdb redis.UniversalClient, prefix string, fence int64) error {
	n, err := rdb.Get(ctx, prefix+"counter").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if err := rdb.RPush(ctx, prefix+"fences", fence).Err(); err != nil {
		return err
	}
	// Widen the window, so that overlapping holders lose updates every run.
	time.Sleep(100 * time.Microsecond)
	return rdb.Set(ctx, prefix+"counter", n+1, 0).Err()
}

// underLoad runs newOp's operation under load and returns the outcome, the
// counter, and the fencing tokens in entry order: on the shared Redis, or,
// with cluster, on the shared Redis Cluster of three masters, which every
// worker process reaches by its nodes' addresses.
func underLoad(t *testing.T, cluster bool, newOp func(t testing.TB, rdb redis.UniversalClient, prefix string) harness.Op) (harness.Result, int64, []int64) {
	var (
		rdb    redis.UniversalClient
		prefix string
	)
	res := harness.Run(t, load,
		func() harness.Params {
			if !cluster {
				rdb, prefix = testserver.Redis(t)
				return harness.Params{"prefix": prefix}
			}
			cl := testserver.RedisCluster(t, 3)
			rdb, prefix = cl, testserver.ClusterPrefix(t, cl)
			return harness.Params{"prefix": prefix, "cluster": strings.Join(cl.Options().Addrs, ",")}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			if p["cluster"] == "" {
				rdb, _ := testserver.Redis(t)
				return newOp(t, rdb, p["prefix"])
			}
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(p["cluster"], ",")})
			t.Cleanup(func() { rdb.Close() })
			return newOp(t, rdb, p["prefix"])
		})
	ctx := context.Background()
	counter, err := rdb.Get(ctx, prefix+"counter").Int64()
	require.NoError(t, err)
	raw, err := rdb.LRange(ctx, prefix+"fences", 0, -1).Result()
	require.NoError(t, err)
	fences := make([]int64, len(raw))
	for i, s := range raw {
		fences[i], err = strconv.ParseInt(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("successes %d, conflicts %d, errors %d, counter %d, p50 %v, p99 %v, max %v",
		res.Successes, res.Conflicts, res.Errors, counter, res.Percentile(.5), res.Percentile(.99), res.Percentile(1))
	return res, counter, fences
}

// Mutual exclusion across processes, checked: the counter is exact, and the
// fencing tokens increase strictly in the order the holders entered.
func TestMutualExclusionAcrossProcesses(t *testing.T) {
	requireExclusion(t, false, distlock.Config{})
}

// The same on a Redis Cluster: every script of the hand-overs between
// processes runs on the key's slot.
func TestMutualExclusionOnACluster(t *testing.T) {
	requireExclusion(t, true, distlock.Config{})
}

// The same, with waiters that check the lock by themselves every few
// milliseconds instead of every half second: their attempts then race the
// releases that hand them the lock all the time, where with the default a
// few of them a run do.
func TestMutualExclusionWithWaitersRechecking(t *testing.T) {
	requireExclusion(t, false, distlock.Config{Recheck: 5 * time.Millisecond})
}

// requireExclusion checks mutual exclusion and fencing order under load,
// with clients made from cfg.
func requireExclusion(t *testing.T, cluster bool, cfg distlock.Config) {
	res, counter, fences := underLoad(t, cluster, func(t testing.TB, rdb redis.UniversalClient, prefix string) harness.Op {
		// Leases long enough that a stalled process does not lose its
		// lock: this test is about exclusion, the fault tests about stalls.
		cfg := cfg
		cfg.Prefix, cfg.TTL, cfg.GrantLease = prefix, 5*time.Second, 5*time.Second
		c := newClient(t, rdb, cfg)
		return func(ctx context.Context, key string) error {
			return c.Do(ctx, key, func(ctx context.Context) error {
				l, _ := distlock.FromContext(ctx)
				return readThenWrite(ctx, rdb, prefix, l.Fence())
			})
		}
	})
	total := load.Processes * load.Goroutines * load.Ops
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Equal(t, total, res.Successes, "every waiter got the lock")
	require.EqualValues(t, total, counter, "lost updates: two holders overlapped")
	require.Len(t, fences, total)
	for i := 1; i < len(fences); i++ {
		require.Greater(t, fences[i], fences[i-1], "fencing token %d did not increase in entry order", i)
	}
}

// The negative control: the same read-then-write without the lock loses
// updates under the same load, so the test above can fail.
func TestWithoutTheLockUpdatesAreLost(t *testing.T) {
	res, counter, _ := underLoad(t, false, func(t testing.TB, rdb redis.UniversalClient, prefix string) harness.Op {
		return func(ctx context.Context, key string) error {
			return readThenWrite(ctx, rdb, prefix, 0)
		}
	})
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	require.Less(t, counter, int64(res.Successes), "no update was lost without a lock")
}

package distlock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workload"
)

// pooled returns a client of rdb's server with a pool of size connections,
// closed when t ends.
func pooled(t *testing.T, rdb *redis.Client, size int) *redis.Client {
	t.Helper()
	opts := *rdb.Options()
	opts.PoolSize = size
	c := redis.NewClient(&opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// counting counts the scripts that a client sends in pipelines of more
// than one.
type counting struct {
	*redis.Client
	batched atomic.Int64
}

func (c *counting) Pipeline() redis.Pipeliner {
	return &hookedPipe{c.Client.Pipeline(), func(_ context.Context, p redis.Pipeliner) error {
		if n := p.Len(); n > 1 {
			c.batched.Add(int64(n))
		}
		return nil
	}}
}

// lockEach has every worker lock a key of its own, rounds times, checking
// that each lock is its own: the reply a caller got from a batch was its
// script's, not a neighbour's.
func lockEach(t *testing.T, c *distlock.Client, rdb redis.UniversalClient, prefix string, workers, rounds int) {
	t.Helper()
	ctx := t.Context()
	workload.Each(t, workers, func(w int) error {
		key := "batch" + strconv.Itoa(w)
		last := int64(0)
		for range rounds {
			l, err := c.Obtain(ctx, key, distlock.MinTTL*100)
			if err != nil {
				return err
			}
			stored, err := rdb.Get(ctx, lockKey(prefix, key)).Result()
			if err != nil {
				return err
			}
			if stored != l.Token() || l.Fence() <= last {
				t.Errorf("worker %d got lock %s (fence %d) but Redis holds %s (last fence %d)", w, l.Token(), l.Fence(), stored, last)
			}
			last = l.Fence()
			if err := l.Release(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// batched has workers lock keys of their own, 50 times each, through a
// client whose Redis pool has size connections, and returns how many
// scripts went out in batches.
func batched(t *testing.T, size, workers int) int64 {
	rdb, prefix := testserver.Redis(t)
	counted := &counting{Client: pooled(t, rdb, size)}
	c := newClient(t, counted, distlock.Config{Prefix: prefix})
	lockEach(t, c, rdb, prefix, workers, 50)
	return counted.batched.Load()
}

// Scripts of more concurrent callers than the client has connections go
// out together, and each caller gets its own script's reply.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	t.Parallel()
	require.Positive(t, batched(t, 4, 32), "no script went out in a batch")
}

// While a connection is free, no call is held back for a batch: it would
// wait a round trip for nothing.
func TestNoBatchWhileAConnectionIsFree(t *testing.T) {
	t.Parallel()
	require.Zero(t, batched(t, 16, 8), "scripts were batched with connections to spare")
}

// A batch sent after Redis lost its scripts still runs them all.
func TestBatchAfterScriptFlush(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	c := newClient(t, pooled(t, rdb, 2), distlock.Config{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	lockEach(t, c, rdb, distlock.DefaultPrefix, 16, 40)
	<-done
}

package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

// The parallel tests wait on leases, timers and Redis restarts, and talk to
// Redis, not to PostgreSQL: eight at a time.
func TestMain(m *testing.M) { testserver.MainWaiting(m, 8) }

// setup returns a client on the shared Redis under a prefix of the test's
// own (cfg.Prefix is replaced), with the plain client and the prefix.
func setup(t testing.TB, cfg distlock.Config) (*distlock.Client, *redis.Client, string) {
	t.Helper()
	rdb, prefix := testserver.Redis(t)
	cfg.Prefix = prefix
	return newClient(t, rdb, cfg), rdb, prefix
}

// twoClients returns two clients on the shared Redis under one prefix of
// the test's own, as two processes would have.
func twoClients(t testing.TB, cfg distlock.Config) (c, other *distlock.Client, rdb *redis.Client, prefix string) {
	t.Helper()
	c, rdb, prefix = setup(t, cfg)
	cfg.Prefix = prefix
	return c, newClient(t, rdb, cfg), rdb, prefix
}

// newClient makes a client, closed when t ends (before the Redis client it
// uses: cleanups run last-registered first).
func newClient(t testing.TB, rdb distlock.RedisClient, cfg distlock.Config) *distlock.Client {
	t.Helper()
	c, err := distlock.NewClient(rdb, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// lockKey is where the lock of key lives.
func lockKey(prefix, key string) string { return prefix + "{" + key + "}" }

// queued reports how many waiters are in key's queue.
func queued(t testing.TB, rdb redis.Cmdable, prefix, key string) int64 {
	t.Helper()
	n, err := rdb.LLen(context.Background(), lockKey(prefix, key)+":queue").Result()
	require.NoError(t, err)
	return n
}

// waitQueued waits until key's queue has n waiters.
func waitQueued(t testing.TB, rdb redis.Cmdable, prefix, key string, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return queued(t, rdb, prefix, key) == n },
		5*time.Second, time.Millisecond, "waiting for %d waiters in the queue", n)
}

// waitDeferred waits until n of c's waiters for key wait behind its head,
// without being queued in Redis.
func waitDeferred(t testing.TB, c *distlock.Client, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return distlock.Deferred(c, key) == n },
		5*time.Second, time.Millisecond, "waiting for %d deferred waiters", n)
}

// waitListening waits until c's subscription is confirmed: from then on a
// release takes c's deferred waiters along.
func waitListening(t testing.TB, c *distlock.Client) {
	t.Helper()
	require.Eventually(t, func() bool { return distlock.Listening(c) },
		5*time.Second, time.Millisecond, "the client's subscription was not confirmed")
}

// stolen does what another holder does to key when the lease of the lock
// on it ran out: it takes the key, with the next fencing token.
func stolen(t testing.TB, rdb *redis.Client, prefix, key string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, lockKey(prefix, key), "intruder", time.Minute).Err())
	require.NoError(t, rdb.Incr(ctx, lockKey(prefix, key)+":fence").Err())
}

type obtained struct {
	l   *distlock.Lock
	err error
}

// obtainAsync runs Obtain on its own goroutine; the result arrives on the
// channel.
func obtainAsync(ctx context.Context, c *distlock.Client, key string, ttl time.Duration) <-chan obtained {
	ch := make(chan obtained, 1)
	go func() {
		l, err := c.Obtain(ctx, key, ttl)
		ch <- obtained{l, err}
	}()
	return ch
}

// receive waits for an asynchronous result, failing t after a while.
func receive[T any](t testing.TB, ch <-chan T, within time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("no result within %v", within)
		panic("unreachable")
	}
}

// handOver releases holder and returns the lock it handed to the waiter
// behind it, whose obtain reports on w.
func handOver(ctx context.Context, t testing.TB, holder *distlock.Lock, w <-chan obtained) *distlock.Lock {
	t.Helper()
	require.NoError(t, holder.Release(ctx))
	got := receive(t, w, 5*time.Second)
	require.NoError(t, got.err)
	return got.l
}

// faulty wraps a Redis client to lose the messages that releases publish
// for its waiters: it subscribes to deaf, a channel nobody publishes on.
// The subscription looks healthy, as one whose messages a proxy dropped
// would, but no proxy can drop one message of a connection and not the
// next.
type faulty struct {
	redis.UniversalClient
	deaf string
}

func (f *faulty) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return f.UniversalClient.Subscribe(ctx, f.deaf)
}

// noSubscribe subscribes to a server that is not there, so the client's
// subscription never comes up.
type noSubscribe struct{ redis.UniversalClient }

func (n *noSubscribe) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	ps := dead.Subscribe(ctx, channels...)
	_ = dead.Close() // the subscription keeps its own connection attempts
	return ps
}

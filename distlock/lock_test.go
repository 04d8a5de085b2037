package distlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
)

func TestObtainRelease(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx := t.Context()

	began := time.Now()
	l, err := c.TryObtain(ctx, "job", time.Second)
	require.NoError(t, err)
	require.Equal(t, "job", l.Key())
	require.Len(t, l.Token(), 32, "128 random bits")
	require.Positive(t, l.Fence())
	// 1% and 2ms are the clocks' drift allowance.
	margin := 12 * time.Millisecond
	require.WithinRange(t, l.ValidUntil(), began.Add(time.Second-margin), time.Now().Add(time.Second-margin),
		"validity counts from the start of the attempt, less the drift allowance")
	stored, err := rdb.Get(ctx, lockKey(prefix, "job")).Result()
	require.NoError(t, err)
	require.Equal(t, l.Token(), stored)
	left, err := l.TTL(ctx)
	require.NoError(t, err)
	require.WithinRange(t, time.Now().Add(left), began.Add(time.Second-margin), time.Now().Add(time.Second),
		"the lock's TTL in Redis counts from the attempt")

	_, err = c.TryObtain(ctx, "job", time.Second)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorContains(t, err, `"job"`, "the conflict names its key")

	require.NoError(t, l.Release(ctx))
	require.NoError(t, l.Release(ctx), "release is idempotent")
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val())
	require.ErrorIs(t, l.Refresh(ctx, 0), contend.ErrLockLost, "a released lock cannot be refreshed")
	_, err = l.TTL(ctx)
	require.ErrorIs(t, err, contend.ErrLockLost)

	next, err := c.TryObtain(ctx, "job", time.Second)
	require.NoError(t, err)
	require.Greater(t, next.Fence(), l.Fence(), "fencing tokens increase")
	require.NotEqual(t, l.Token(), next.Token())
	require.NoError(t, next.Release(ctx))
}

func TestRefreshExtendsButNeverRevives(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx := t.Context()
	l, err := c.TryObtain(ctx, "job", 200*time.Millisecond)
	require.NoError(t, err)
	before := l.ValidUntil()
	require.NoError(t, l.Refresh(ctx, 5*time.Second))
	require.True(t, l.ValidUntil().After(before.Add(4*time.Second)), "the validity moved")
	left, err := l.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, left, 4*time.Second)

	// The lease runs out (made to, rather than waited for): a refresh must
	// not take the free key again, its holder may already know it lost it.
	require.NoError(t, rdb.Del(ctx, lockKey(prefix, "job")).Err())
	require.ErrorIs(t, l.Refresh(ctx, 0), contend.ErrLockLost)
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val(), "refresh re-acquired an expired lock")
	require.ErrorIs(t, l.Release(ctx), contend.ErrLockLost, "the release says it was no longer held")
}

// The keys of one lock share the hash tag {key}, so a Cluster keeps them on
// one slot; they all expire by themselves, the fencing counter a day after
// its lock was last obtained or refreshed.
func TestKeysShareAHashTag(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "a:b", time.Minute)
	require.NoError(t, err)
	waiter := obtainAsync(ctx, c, "a:b", time.Minute)
	waitQueued(t, rdb, prefix, "a:b", 1)

	keys, err := rdb.Keys(ctx, strings.ReplaceAll(prefix, "*", `\*`)+"*").Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{
		prefix + "{a:b}", prefix + "{a:b}:fence", prefix + "{a:b}:queue", prefix + "{a:b}:waiters",
	}, keys)
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if strings.HasSuffix(k, ":fence") {
			require.InDelta(t, 24*time.Hour, ttl, float64(time.Minute), "the fencing counter lives a day after its last use")
		} else {
			require.Positive(t, ttl, "%s must expire by itself", k)
		}
	}
	require.NoError(t, handOver(ctx, t, holder, waiter).Release(ctx))
}

// The compare-and-delete rule: the release of a lock whose lease ran out must not
// delete the lock of whoever holds the key now.
func TestStaleReleaseKeepsTheNewHolder(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx := t.Context()
	old, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, lockKey(prefix, "job")).Err()) // its lease ran out
	current, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)

	require.ErrorIs(t, old.Release(ctx), contend.ErrLockLost)
	require.ErrorIs(t, old.Refresh(ctx, 0), contend.ErrLockLost)
	stored, err := rdb.Get(ctx, lockKey(prefix, "job")).Result()
	require.NoError(t, err)
	require.Equal(t, current.Token(), stored, "the stale release deleted the new holder's lock")
	require.NoError(t, current.Refresh(ctx, 0))
	require.NoError(t, current.Release(ctx))
}

// The same rule for a lock obtained by waiting, whose release runs the
// script that hands the lock on to the next waiter: a release of such a lock
// whose lease ran out neither deletes nor hands on the lock of whoever holds
// the key now.
func TestStaleReleaseOfAWaitedForLockKeepsTheNewHolder(t *testing.T) {
	t.Parallel()
	// A long recheck: the waiter gets the lock from the release, not by
	// asking again.
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	first, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	w := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	waitListening(t, c)
	old := handOver(ctx, t, first, w)
	stolen(t, rdb, prefix, "job") // old's lease ran out, and another took the key

	require.ErrorIs(t, old.Release(ctx), contend.ErrLockLost, "a release of a lock someone else holds succeeded")
	stored, err := rdb.Get(ctx, lockKey(prefix, "job")).Result()
	require.NoError(t, err, "the stale release deleted the new holder's lock")
	require.Equal(t, "intruder", stored, "the stale release changed the new holder's lock")
}

// The negative control of the test above: a release that reads the token
// and then deletes the key, two commands, deletes the new holder's lock when
// the old lease runs out between them, and a third caller gets in beside the
// second.
func TestNaiveReleaseDeletesTheNewHolder(t *testing.T) {
	t.Parallel()
	rdb, prefix := redisOnly(t)
	ctx := t.Context()
	key := lockKey(prefix, "job")
	naiveObtain := func(tok string) bool { return rdb.SetNX(ctx, key, tok, time.Minute).Val() }

	require.True(t, naiveObtain("old"))
	stored := rdb.Get(ctx, key).Val() // the naive release's GET: "still mine"
	require.Equal(t, "old", stored)
	require.NoError(t, rdb.Del(ctx, key).Err()) // meanwhile the lease runs out...
	require.True(t, naiveObtain("new"))         // ...and the next caller gets the lock
	require.NoError(t, rdb.Del(ctx, key).Err()) // the naive release's DEL
	require.True(t, naiveObtain("third"), "the naive release let a third holder in beside the second")
}

func redisOnly(t *testing.T) (*redis.Client, string) {
	_, rdb, prefix := setup(t, distlock.Config{})
	return rdb, prefix
}

// Release works when the caller has already given up: that is when it
// matters most.
func TestReleaseWithCancelledContext(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	l, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	cancel()
	require.NoError(t, l.Release(ctx))
	require.Zero(t, rdb.Exists(t.Context(), lockKey(prefix, "job")).Val())
}

// Do hands fn its lock, whose fencing token fn passes to what it writes.
func TestDoHandsFnItsLock(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{TTL: time.Second})
	ctx := t.Context()
	_, ok := distlock.FromContext(ctx)
	require.False(t, ok)
	var fence int64
	err := c.Do(ctx, "job", func(ctx context.Context) error {
		l, ok := distlock.FromContext(ctx)
		require.True(t, ok)
		require.Equal(t, "job", l.Key())
		fence = l.Fence()
		stored := rdb.Get(ctx, lockKey(prefix, "job")).Val()
		require.Equal(t, l.Token(), stored)
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, fence)
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val(), "Do released")
}

package distlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
)

// A holder whose lease ran out, and whose key another client took, must not
// extend the new holder's lease by refreshing: the refresh compares tokens
// in Redis. The stale holder refreshes before any Release of its own, so the
// call reaches the script (a Release would mark the lock as let go in the
// client first).
func TestStaleRefreshLeavesTheNewHolder(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{})
	ctx := t.Context()
	old, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, lockKey(prefix, "job")).Err()) // its lease ran out
	current, err := other.TryObtain(ctx, "job", 20*time.Second)
	require.NoError(t, err)

	require.ErrorIs(t, old.Refresh(ctx, time.Hour), contend.ErrLockLost,
		"a stale holder's refresh succeeded on another holder's key")
	requireNewHolderKept(t, rdb, lockKey(prefix, "job"), current.Token(), 20*time.Second)
	require.NoError(t, current.Release(ctx))
}

// The same for a Quorum: on every node, the stale refresh leaves the new
// holder's lease as it was.
func TestQuorumStaleRefreshLeavesTheNewHolder(t *testing.T) {
	t.Parallel()
	old, current, clients, key := staleQuorum(t)
	require.ErrorIs(t, old.Refresh(t.Context(), time.Hour), contend.ErrLockLost,
		"a stale quorum holder's refresh succeeded on another holder's key")
	for _, n := range clients {
		requireNewHolderKept(t, n, key, current.Token(), 20*time.Second)
	}
	require.NoError(t, current.Release(t.Context()))
}

// A stale quorum holder's release leaves the new holder's lock on every
// node: the release compares tokens node by node.
func TestQuorumStaleReleaseLeavesTheNewHolder(t *testing.T) {
	t.Parallel()
	old, current, clients, key := staleQuorum(t)
	require.ErrorIs(t, old.Release(t.Context()), contend.ErrLockLost,
		"a stale quorum holder's release succeeded on another holder's key")
	for _, n := range clients {
		requireNewHolderKept(t, n, key, current.Token(), 20*time.Second)
	}
	require.NoError(t, current.Release(t.Context()))
}

// staleQuorum returns, on 3 nodes, a lock whose lease ran out on every node
// and the lock another Quorum then took for 20s, with the nodes and the
// key.
func staleQuorum(t *testing.T) (old, current *distlock.Lock, clients []*redis.Client, key string) {
	t.Helper()
	_, clients, asNodes := nodes(t, 3)
	q, other := newQuorum(t, asNodes), newQuorum(t, asNodes)
	ctx := t.Context()
	old, err := q.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	key = "distlock:{job}"
	for _, n := range clients {
		require.NoError(t, n.Del(ctx, key).Err()) // its lease ran out everywhere
	}
	current, err = other.TryObtain(ctx, "job", 20*time.Second)
	require.NoError(t, err)
	return old, current, clients, key
}

// requireNewHolderKept checks that key still holds token with no more than
// ttl left: nobody extended the holder's lease.
func requireNewHolderKept(t *testing.T, rdb redis.Cmdable, key, token string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	stored, err := rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Contains(t, stored, token, "the new holder's lock is gone")
	left, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, left, ttl, "the stale refresh extended the new holder's lease")
	require.Positive(t, left)
}

package distlock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

// On a real Redis Cluster every script touches only keys of one slot: a
// lock's keys share the key's hash tag. Locks on keys spread over the
// masters take every script: take and free, a wait in line (acquire) and
// its hand-over to another process (release, then the waiter's attempt),
// refresh. The negative control: keys with an empty hash tag, what a key
// starting with '}' would make, are refused by the cluster (CROSSSLOT), and
// the client refuses such a key before it reaches Redis.
func TestClusterKeepsALocksKeysOnOneSlot(t *testing.T) {
	t.Parallel()
	rdb := testserver.RedisCluster(t, 3)
	ctx := t.Context()
	c := newClient(t, rdb, distlock.Config{})
	other := newClient(t, rdb, distlock.Config{})
	slots := map[int64]bool{}
	for i := range 12 {
		key := fmt.Sprintf("job:%d", i)
		slot, err := rdb.ClusterKeySlot(ctx, lockKey(distlock.DefaultPrefix, key)).Result()
		require.NoError(t, err)
		slots[slot] = true

		alone, err := c.TryObtain(ctx, key, time.Minute)
		require.NoError(t, err, "key %s", key)
		require.NoError(t, alone.Release(ctx), "key %s", key)

		holder, err := c.TryObtain(ctx, key, time.Minute)
		require.NoError(t, err, "key %s", key)
		w := obtainAsync(ctx, other, key, time.Minute)
		waitQueued(t, rdb, distlock.DefaultPrefix, key, 1)
		require.NoError(t, holder.Refresh(ctx, 0), "key %s", key)
		next := handOver(ctx, t, holder, w)
		require.Greater(t, next.Fence(), holder.Fence(), "key %s", key)
		require.NoError(t, next.Release(ctx), "key %s", key)
	}
	require.Greater(t, len(slots), 1, "the keys all hashed to one slot")

	err := rdb.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"p{}job}", "p{}job}:fence"}).Err()
	require.ErrorContains(t, err, "CROSSSLOT", "keys with an empty hash tag, in one script")
	_, err = c.TryObtain(ctx, "}job", time.Second)
	require.ErrorIs(t, err, contend.ErrInvalid)
}

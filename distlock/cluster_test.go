package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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
	prefix := testserver.ClusterPrefix(t, rdb)
	ctx := t.Context()
	c := newClient(t, rdb, distlock.Config{Prefix: prefix})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	slots := map[int64]bool{}
	for i := range 12 {
		key := fmt.Sprintf("job:%d", i)
		slot, err := rdb.ClusterKeySlot(ctx, lockKey(prefix, key)).Result()
		require.NoError(t, err)
		slots[slot] = true

		alone, err := c.TryObtain(ctx, key, time.Minute)
		require.NoError(t, err, "key %s", key)
		require.NoError(t, alone.Release(ctx), "key %s", key)

		holder, err := c.TryObtain(ctx, key, time.Minute)
		require.NoError(t, err, "key %s", key)
		w := obtainAsync(ctx, other, key, time.Minute)
		waitQueued(t, rdb, prefix, key, 1)
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

// A master of a Cluster with replicas crashes while a lock on one of its
// slots is held, and its replica takes over. The replica had the lock and
// the fencing counter (the test waits for the copy, as WAIT would): the
// holder whose lease outlasts the failover keeps its lock, refreshed on
// the new master, and nobody else gets the key meanwhile; a holder whose
// lease runs out first is told at its validity, by its timer, while the
// master is gone. Fencing tokens only grow across the failover.
func TestClusterFailoverWhileHeld(t *testing.T) {
	t.Parallel()
	cl := testserver.StartCluster(t, testserver.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	ctx := t.Context()
	var refreshFailed atomic.Int32
	c := newClient(t, cl.Client, distlock.Config{Observer: contend.ObserverFunc(func(_ context.Context, e contend.Event) {
		if e.Kind == contend.EventFailed {
			refreshFailed.Add(1)
		}
	})})
	other := newClient(t, cl.Client, distlock.Config{})

	// Two keys on one master, so that one crash takes both; a failover
	// needs a majority of the masters alive to agree.
	master, err := cl.Client.MasterForKey(ctx, lockKey("distlock:", "long"))
	require.NoError(t, err)
	addr := master.Options().Addr
	shortKey := ""
	for i := 0; shortKey == ""; i++ {
		key := fmt.Sprintf("short%d", i)
		m, err := cl.Client.MasterForKey(ctx, lockKey("distlock:", key))
		require.NoError(t, err)
		if m.Options().Addr == addr {
			shortKey = key
		}
	}
	long, err := c.TryObtain(ctx, "long", 12*time.Second)
	require.NoError(t, err)
	longCtx := long.Hold(ctx)
	firstValid := long.ValidUntil()
	short, err := c.TryObtain(ctx, shortKey, time.Second)
	require.NoError(t, err)
	shortCtx := short.Hold(ctx)
	n, err := master.Wait(ctx, 1, 5*time.Second).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the replica did not get the locks")
	// A plain timer for the same instant tells how late this machine's
	// scheduler runs anyone's timer; the bound adds that lag.
	plain := make(chan time.Duration, 1)
	time.AfterFunc(time.Until(short.ValidUntil()), func() { plain <- time.Since(short.ValidUntil()) })
	crashed := time.Now()
	require.NoError(t, cl.Node(addr).Kill())

	// The short lease ends during the failover: its holder is told by its
	// timer, though every call to the dead master fails or waits.
	<-shortCtx.Done()
	lag := time.Since(short.ValidUntil())
	require.ErrorIs(t, context.Cause(shortCtx), contend.ErrLockLost)
	plainLag := max(0, <-plain)
	require.Less(t, lag, 50*time.Millisecond+plainLag, "told %v after the validity (a plain timer fired %v late)", lag, plainLag)

	// Nobody else gets the long lock while its holder keeps it; its holder
	// keeps it across the failover, refreshed (every 4s) on the new master
	// once the client has read the cluster's new map. A refresh that met
	// the dead master is tried again a third of the lease later: the one
	// that reaches the new master comes before the first validity. The key
	// is watched from the crash until that refresh.
	var failedOver time.Duration
	for failedOver == 0 || !long.ValidUntil().After(firstValid) {
		require.True(t, time.Now().Before(firstValid), "the replica never took over (%v after the crash), or the lock was never refreshed on the new master", failedOver)
		_, err := other.TryObtain(ctx, "long", time.Second)
		require.Error(t, err, "another client obtained a held key during the failover")
		if errors.Is(err, contend.ErrConflict) && failedOver == 0 {
			failedOver = time.Since(crashed) // the new master answers
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, longCtx.Err(), "the holder lost a lock the new master kept")
	require.NoError(t, long.Release(ctx))

	for _, old := range []*distlock.Lock{long, short} {
		next, err := other.Obtain(ctx, old.Key(), time.Second)
		require.NoError(t, err)
		require.Greater(t, next.Fence(), old.Fence(), "%s: fencing tokens went back across the failover", old.Key())
		require.NoError(t, next.Release(ctx))
	}
	t.Logf("failover: the new master answered %v after the crash; the short holder was told %v after its validity; %d refreshes failed meanwhile",
		failedOver.Round(time.Millisecond), lag, refreshFailed.Load())
}

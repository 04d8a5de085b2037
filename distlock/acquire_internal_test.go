package distlock

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/token"
)

// A waiter whose attempt finds the lock granted to it leaves the queue: an
// in-turn hand-over (the pass script) grants without a look at the queue,
// so the place that an earlier attempt took can still be there.
func TestAttemptThatFindsItsGrantLeavesTheQueue(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	c, err := NewClient(rdb, Config{Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(t.Context())) })
	ctx := t.Context()
	keys, tok := c.keys("job", new([4]string)), token.New()
	// What an attempt of tok's left behind, and then a pass to tok.
	// The entry's format is queue.lua's waiter_entry: deadline_ms grant_ms ttl_ms channel.
	entry := fmt.Sprintf("%d 1000 60000 %s", time.Now().Add(time.Minute).UnixMilli(), c.channel)
	require.NoError(t, rdb.HSet(ctx, keys[3], tok, entry).Err())
	require.NoError(t, rdb.RPush(ctx, keys[2], tok).Err())
	require.NoError(t, rdb.Set(ctx, keys[0], tok, time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, keys[1], 41, 0).Err())

	l, err := c.try(ctx, "job", keys, &waiter{tok: tok, ttl: time.Minute}, true)
	require.NoError(t, err)
	require.NotNil(t, l, "the attempt did not find its grant")
	require.Equal(t, int64(41), l.Fence())
	require.Zero(t, rdb.LLen(ctx, keys[2]).Val(), "the waiter's place is still in the queue")
	require.False(t, rdb.HExists(ctx, keys[3], tok).Val(), "the waiter's entry is still there")
}

package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

// Waiters are served in the order they arrived, each handed the lock by the
// release before it, with a larger fencing token each time: clients
// (processes) in the order they queued in Redis, and a client's own waiters,
// who wait behind the one it queued, in the order they came.
func TestWaitersAreServedInOrder(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	waitersServedInOrder(t, rdb, prefix)
}

// The same on a Redis Cluster: the hand-overs' messages reach the other
// clients' subscriptions from whichever node runs the key's slot.
func TestWaitersAreServedInOrderOnACluster(t *testing.T) {
	t.Parallel()
	rdb := testserver.RedisCluster(t, 3)
	waitersServedInOrder(t, rdb, testserver.ClusterPrefix(t, rdb))
}

func waitersServedInOrder(t *testing.T, rdb redis.UniversalClient, prefix string) {
	// A long recheck: the hand-overs below must come from the releases, not
	// from the waiters checking by themselves.
	cfg := distlock.Config{Prefix: prefix, Recheck: time.Minute}
	c, holding := newClient(t, rdb, cfg), newClient(t, rdb, cfg)
	ctx := t.Context()
	holder, err := holding.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	var waiters []<-chan obtained
	for i := range 3 {
		waiters = append(waiters, obtainAsync(ctx, newClient(t, rdb, cfg), "job", time.Minute))
		waitQueued(t, rdb, prefix, "job", int64(i+1))
	}
	for i := range 3 {
		waiters = append(waiters, obtainAsync(ctx, c, "job", time.Minute))
		if i == 0 {
			waitQueued(t, rdb, prefix, "job", 4)
		} else {
			waitDeferred(t, c, "job", i)
		}
	}
	require.Equal(t, int64(4), queued(t, rdb, prefix, "job"), "a client queues one waiter of a key at a time")
	_, err = c.TryObtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict, "a newcomer does not jump the queue")

	last := holder
	for i, w := range waiters {
		require.NoError(t, last.Release(ctx))
		got := receive(t, w, 5*time.Second)
		require.NoError(t, got.err, "waiter %d", i)
		require.Greater(t, got.l.Fence(), last.Fence(), "waiter %d", i)
		require.Equal(t, int64(max(3-i, 0)), queued(t, rdb, prefix, "job"), "waiter %d came out of turn", i)
		// The waiter holds the lock for its own TTL, whichever client's
		// release handed it over.
		left, err := got.l.TTL(ctx)
		require.NoError(t, err)
		require.Greater(t, left, 50*time.Second, "waiter %d holds the lock for less than its TTL", i)
		require.True(t, got.l.ValidUntil().After(time.Now().Add(50*time.Second)), "waiter %d's validity", i)
		last = got.l
	}
	require.NoError(t, last.Release(ctx))
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val())
}

// A release that hands the lock to a waiter of its own client wakes it from
// the script's reply, publishing nothing; a waiter of another client (another
// process) is told on its client's channel.
func TestLocalGrantIsNotPublished(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	grants := rdb.PSubscribe(ctx, prefix+"grants:*")
	defer grants.Close()
	_, err := grants.Receive(ctx) // the subscription is confirmed
	require.NoError(t, err)

	holder, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	local := obtainAsync(ctx, c, "job", time.Minute)
	waitDeferred(t, c, "job", 1)
	mine := handOver(ctx, t, holder, local)
	require.Greater(t, mine.Fence(), holder.Fence())
	select {
	case m := <-grants.Channel():
		t.Fatalf("a grant to a waiter of the releasing client was published: %v", m)
	case <-time.After(100 * time.Millisecond):
	}

	remote := obtainAsync(ctx, other, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	theirs := handOver(ctx, t, mine, remote)
	require.Greater(t, theirs.Fence(), mine.Fence())
	m := receive(t, grants.Channel(), 5*time.Second)
	require.Regexp(t, "^[0-9a-f]{32}$", m.Payload, "the other client's waiter is told its token, and only that")
	require.NoError(t, theirs.Release(ctx))
}

// A waiter whose own client holds the key does not queue by itself: the
// holder's release queues it, behind every waiter already in line, and a
// process cannot pass a key among its own goroutines ahead of others.
func TestWaiterBehindItsOwnClientIsQueuedByTheRelease(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	holder, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	local := obtainAsync(ctx, c, "job", time.Minute)
	gaveUp, giveUp := context.WithCancel(ctx)
	leaving := obtainAsync(gaveUp, c, "job", time.Minute)
	waitDeferred(t, c, "job", 2)
	waitListening(t, c)
	require.Zero(t, queued(t, rdb, prefix, "job"), "a waiter behind its own client's lock queued by itself")
	giveUp()
	require.ErrorIs(t, receive(t, leaving, 5*time.Second).err, context.Canceled)
	remote := obtainAsync(ctx, other, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)

	theirs := handOver(ctx, t, holder, remote)
	require.Greater(t, theirs.Fence(), holder.Fence())
	require.Equal(t, int64(1), queued(t, rdb, prefix, "job"), "the release queued the local waiter, and only the one still waiting")
	mine := handOver(ctx, t, theirs, local)
	require.Greater(t, mine.Fence(), theirs.Fence())
	require.Zero(t, queued(t, rdb, prefix, "job"))
	require.NoError(t, mine.Release(ctx))
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val())
}

// A waiter deferred behind a lock of its own client that is never released
// checks by itself, queues, and gets the key when the lease runs out.
func TestDeferredWaiterChecksByItself(t *testing.T) {
	t.Parallel()
	c, _, _ := setup(t, distlock.Config{Recheck: 20 * time.Millisecond})
	ctx := t.Context()
	forgotten, err := c.TryObtain(ctx, "job", 200*time.Millisecond)
	require.NoError(t, err)
	l, err := c.Obtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	require.Greater(t, l.Fence(), forgotten.Fence())
	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, forgotten.Release(ctx), contend.ErrLockLost)
}

// A waiter whose ctx ends stops at once, with an error that says both "busy"
// and why it stopped, and leaves the queue: the next release does not hand
// the lock to it.
func TestCancelledWaitReturnsPromptly(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	holder, err := other.TryObtain(t.Context(), "job", time.Minute)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	waiter := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	cancelled := time.Now()
	cancel()
	got := receive(t, waiter, 5*time.Second)
	took := time.Since(cancelled)
	require.ErrorIs(t, got.err, contend.ErrConflict)
	require.ErrorIs(t, got.err, context.Canceled)
	require.Less(t, took, time.Second, "the wait did not stop promptly")
	waitQueued(t, rdb, prefix, "job", 0) // the waiter's leave runs on the client's goroutine

	deadline, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = c.Obtain(deadline, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	waitQueued(t, rdb, prefix, "job", 0)

	require.NoError(t, holder.Release(t.Context()))
	require.Zero(t, rdb.Exists(t.Context(), lockKey(prefix, "job")).Val(), "the lock went to a waiter that had left")
}

// A deferred waiter that gives up leaves its client's line at once, from
// wherever it stands in it, and those behind it are served in their order.
func TestDeferredWaiterLeavesTheLine(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	head := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	var line []<-chan obtained
	cancels := make([]context.CancelFunc, 3)
	for i := range cancels {
		var wctx context.Context
		wctx, cancels[i] = context.WithCancel(ctx)
		t.Cleanup(cancels[i])
		line = append(line, obtainAsync(wctx, c, "job", time.Minute))
		waitDeferred(t, c, "job", i+1)
	}

	cancels[1]()
	got := receive(t, line[1], 5*time.Second)
	require.ErrorIs(t, got.err, contend.ErrConflict)
	require.ErrorIs(t, got.err, context.Canceled)
	waitDeferred(t, c, "job", 2)

	l := handOver(ctx, t, holder, head)
	l = handOver(ctx, t, l, line[0])
	l = handOver(ctx, t, l, line[2])
	require.NoError(t, l.Release(ctx))
	require.Zero(t, distlock.Deferred(c, "job"))
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val(), "the lock went to the waiter that had left")
}

// An Obtain whose ctx ends before it has the lock gave up waiting, even
// when that happens during its first attempt: busy and ctx's error, both.
// TryObtain, which never waits, reports ctx's error only.
func TestObtainCutShortBeforeWaiting(t *testing.T) {
	t.Parallel()
	onBothKinds(t, cutShortBeforeWaiting)
}

func cutShortBeforeWaiting(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	c, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix})
	proxy.Blackhole() // the first attempt does not come back before the deadline
	defer func() { proxy.Heal(); proxy.Reset() }()
	// Long enough that a loaded machine still starts the call before the
	// deadline: a ctx that ended before the call is only ctx's error.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Obtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = c.TryObtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, contend.ErrConflict)
}

// Without a deadline of the caller's, a wait still ends: MaxWait.
func TestWaitIsBounded(t *testing.T) {
	t.Parallel()
	c, _, _ := setup(t, distlock.Config{MaxWait: 100 * time.Millisecond})
	holder, err := c.TryObtain(t.Context(), "job", time.Minute)
	require.NoError(t, err)
	_, err = c.Obtain(context.Background(), "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, holder.Release(t.Context()))
}

// A waiter granted the lock while it gives up passes the lock on, in the
// same step that takes it out of the queue: the next waiter gets it at once,
// not when the grant lease runs out.
func TestGivingUpPassesOnAGrant(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{Recheck: time.Minute, GrantLease: time.Minute})
	// The first waiter's process never hears of its grant: it sits granted
	// but unaware until it gives up.
	unaware := newClient(t, &faulty{UniversalClient: rdb, deaf: prefix + "nowhere"},
		distlock.Config{Prefix: prefix, Recheck: time.Minute, GrantLease: time.Minute})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix, Recheck: time.Minute})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	first, cancelFirst := context.WithCancel(ctx)
	defer cancelFirst()
	w1 := obtainAsync(first, unaware, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	w2 := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 2)

	require.NoError(t, holder.Release(ctx))
	require.Equal(t, int64(1), queued(t, rdb, prefix, "job"), "the release granted the first waiter")
	require.NotEmpty(t, rdb.Get(ctx, lockKey(prefix, "job")).Val())

	cancelFirst()
	require.ErrorIs(t, receive(t, w1, 5*time.Second).err, context.Canceled)
	got := receive(t, w2, 5*time.Second) // far less than the minute-long grant lease
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))
}

// A grant whose message is lost (the waiter's subscription hears nothing) is
// found by the waiter's own timed re-check.
func TestLostGrantIsFoundByTheRecheck(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	deaf := newClient(t, &faulty{UniversalClient: rdb, deaf: prefix + "nowhere"},
		distlock.Config{Prefix: prefix, Recheck: 50 * time.Millisecond})
	ctx := t.Context()
	holder, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	w := obtainAsync(ctx, deaf, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	next := handOver(ctx, t, holder, w)
	require.Greater(t, next.Fence(), holder.Fence())
	require.NoError(t, next.Release(ctx))
}

// A waiter that cannot subscribe at all still gets the lock, polling with
// jittered backoff.
func TestWaitsWithoutASubscription(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	polling := newClient(t, &noSubscribe{rdb}, distlock.Config{Prefix: prefix, Recheck: 100 * time.Millisecond})
	ctx := t.Context()
	holder, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	w := obtainAsync(ctx, polling, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	require.NoError(t, handOver(ctx, t, holder, w).Release(ctx))
}

// A grant to a waiter whose process died holds the key for the short grant
// lease only, not for the waiter's TTL; the waiter behind it gets the lock.
func TestGrantToADeadWaiterLapses(t *testing.T) {
	t.Parallel()
	const grantLease = 200 * time.Millisecond
	c, rdb, prefix := setup(t, distlock.Config{Recheck: 50 * time.Millisecond})
	ghost, dead := behind(t, rdb, redis.Options{}, distlock.Config{Prefix: prefix, Recheck: time.Minute, GrantLease: grantLease})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	ghostCtx, cancelGhost := context.WithCancel(ctx)
	gw := obtainAsync(ghostCtx, ghost, "job", time.Hour)
	waitQueued(t, rdb, prefix, "job", 1)
	dead.Blackhole() // the ghost's process is cut off: it will never accept
	w := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 2)

	released := time.Now()
	require.NoError(t, holder.Release(ctx)) // with the ghost's grant lease, not its hour
	got := receive(t, w, 10*time.Second)
	require.NoError(t, got.err)
	require.Less(t, time.Since(released), 5*time.Second)
	require.NoError(t, got.l.Release(ctx))

	cancelGhost()
	dead.Heal()
	dead.Reset()
	require.ErrorIs(t, receive(t, gw, 5*time.Second).err, context.Canceled)
}

// Close ends the waits in progress, and refuses new calls.
func TestCloseEndsWaits(t *testing.T) {
	t.Parallel()
	rdb, prefix := redisOnly(t)
	c, err := distlock.NewClient(rdb, distlock.Config{Prefix: prefix})
	require.NoError(t, err)
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	w := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	require.NoError(t, c.Close(ctx))
	require.NoError(t, c.Close(ctx), "Close is idempotent")
	require.ErrorIs(t, receive(t, w, 5*time.Second).err, contend.ErrClosed)
	_, err = c.Obtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrClosed)
	require.Zero(t, queued(t, rdb, prefix, "job"))
	require.NoError(t, holder.Release(ctx))
}

// A Redis failure is not "busy": it stays its own error.
func TestRedisFailureIsNotAConflict(t *testing.T) {
	t.Parallel()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { down.Close() })
	c := newClient(t, down, distlock.Config{})
	for _, obtain := range []func(context.Context, string, time.Duration) (*distlock.Lock, error){c.TryObtain, c.Obtain} {
		_, err := obtain(t.Context(), "job", time.Minute)
		var opErr *net.OpError
		require.ErrorAs(t, err, &opErr, "the network error stays reachable")
		require.NotErrorIs(t, err, contend.ErrConflict)
	}
	require.ErrorIs(t, c.Do(t.Context(), "job", func(context.Context) error { return nil }), syscall.ECONNREFUSED)
}

// A message on a waiter's channel is only a hint to look: a client that
// may PUBLISH (on a shared Redis, any) cannot hand a waiter a lock that
// another process holds, in the message format of a real grant or any
// other.
func TestForgedGrantIsNotBelieved(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	holder, err := other.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	w := obtainAsync(ctx, c, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	waiting := rdb.LIndex(ctx, lockKey(prefix, "job")+":queue", 0).Val()
	channels, err := rdb.PubSubChannels(ctx, prefix+"grants:*").Result()
	require.NoError(t, err)
	require.Len(t, channels, 1, "only the waiter's client subscribes")
	for _, forged := range []string{waiting, waiting + " 999999999", waiting + " 1 999999999"} {
		require.NoError(t, rdb.Publish(ctx, channels[0], forged).Err())
	}
	select {
	case got := <-w:
		t.Fatalf("a forged message handed the waiter the lock (fence %v, err %v)", got.l, got.err)
	case <-time.After(300 * time.Millisecond):
	}
	require.Equal(t, holder.Token()+"|q", rdb.Get(ctx, lockKey(prefix, "job")).Val(), "the holder's lock was touched")
	next := handOver(ctx, t, holder, w)
	require.Greater(t, next.Fence(), holder.Fence())
	require.NoError(t, next.Release(ctx))
}

// The Observer sees obtains with their waits, attempts and fencing
// tokens, busy keys, waits given up, releases and losses with how long the
// hold lasted, each with the context of the call it belongs to.
func TestObserverReportsEvents(t *testing.T) {
	t.Parallel()
	type callKey struct{}
	var (
		mu     sync.Mutex
		events []contend.Event
	)
	observer := contend.ObserverFunc(func(ctx context.Context, e contend.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Value(callKey{}) == nil {
			e.Err = fmt.Errorf("no call context: %w", e.Err)
		}
		events = append(events, e)
	})
	taken := func() []contend.Event {
		mu.Lock()
		defer mu.Unlock()
		es := events
		events = nil
		return es
	}
	kinds := func(es []contend.Event) []contend.EventKind {
		var ks []contend.EventKind
		for _, e := range es {
			require.Equal(t, contend.StrategyDistlock, e.Strategy)
			require.Equal(t, "job", e.Key)
			ks = append(ks, e.Kind)
		}
		return ks
	}
	c, rdb, prefix := setup(t, distlock.Config{Observer: observer, Recheck: 20 * time.Millisecond})
	ctx := context.WithValue(t.Context(), callKey{}, "call")

	l, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	_, err = c.TryObtain(ctx, "job", time.Minute)
	require.ErrorIs(t, err, contend.ErrConflict)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = c.Obtain(short, "job", time.Minute)
	cancel()
	require.ErrorIs(t, err, contend.ErrConflict)
	time.Sleep(time.Millisecond) // a hold measured in whole milliseconds
	require.NoError(t, l.Release(ctx))
	es := taken()
	require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventConflict, contend.EventGaveUp, contend.EventReleased}, kinds(es))
	obtained, busy, gaveUp, released := es[0], es[1], es[2], es[3]
	require.Equal(t, l.Fence(), obtained.Fence)
	require.Equal(t, 1, obtained.Attempts)
	require.Positive(t, obtained.Wait)
	require.NoError(t, obtained.Err)
	require.ErrorIs(t, busy.Err, contend.ErrConflict)
	require.ErrorIs(t, gaveUp.Err, contend.ErrConflict)
	require.ErrorIs(t, gaveUp.Err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, gaveUp.Wait, 15*time.Millisecond)
	require.Equal(t, l.Fence(), released.Fence)
	require.GreaterOrEqual(t, released.Hold, 20*time.Millisecond, "held across the wait that gave up")
	require.Equal(t, obtained.Wait, released.Wait, "a hold's events carry the wait that began it")
	require.NoError(t, released.Err)

	// A waiter that gets the lock reports how long it waited; Do reports
	// the hold's end when fn returns.
	l, err = c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		done <- c.Do(ctx, "job", func(context.Context) error { return nil })
	}()
	waitDeferred(t, c, "job", 1)
	time.Sleep(30 * time.Millisecond) // a wait long enough to see
	require.NoError(t, l.Release(ctx))
	require.NoError(t, <-done)
	es = taken()
	// The waiter's obtain and the release that handed it over are reported
	// by two goroutines: in either order.
	require.ElementsMatch(t, []contend.EventKind{contend.EventObtained, contend.EventReleased, contend.EventObtained, contend.EventReleased}, kinds(es))
	for _, e := range es {
		if e.Kind == contend.EventObtained && e.Fence != l.Fence() {
			require.GreaterOrEqual(t, e.Wait, 30*time.Millisecond)
			require.GreaterOrEqual(t, e.Attempts, 1)
			require.Greater(t, e.Fence, l.Fence())
		}
	}

	l, err = c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	stolen(t, rdb, prefix, "job")
	require.NoError(t, rdb.Del(ctx, lockKey(prefix, "job")).Err())
	require.ErrorIs(t, l.Release(ctx), contend.ErrLockLost)
	es = taken()
	require.Equal(t, []contend.EventKind{contend.EventObtained, contend.EventLost}, kinds(es))
	require.ErrorIs(t, es[1].Err, contend.ErrLockLost)
	require.Positive(t, es[1].Hold)
}

// A client forgets keys it remembered only because a waiter queued on them
// once: waiting on many keys leaves its memory bounded.
func TestBusyKeysAreBounded(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{Recheck: time.Minute})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	ctx := t.Context()
	for i := range 1500 {
		key := "busy" + strconv.Itoa(i)
		held, err := other.TryObtain(ctx, key, time.Minute)
		require.NoError(t, err)
		// Until one wait on the key was cut short: on a loaded machine the
		// millisecond can pass before Obtain begins, which then tries
		// nothing and returns the bare ctx error.
		for range 100 {
			short, cancel := context.WithTimeout(ctx, time.Millisecond)
			_, err = c.Obtain(short, key, time.Minute)
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			if errors.Is(err, contend.ErrConflict) {
				break
			}
		}
		require.ErrorIs(t, err, contend.ErrConflict, "no wait on %s began", key)
		require.NoError(t, held.Release(ctx))
	}
	require.LessOrEqual(t, distlock.Known(c), 1024+32)
}

// queueBehind has b hold "job" and two waiters of a's wait for it: a1
// queued in Redis, a2 deferred behind a1.
func queueBehind(ctx context.Context, t *testing.T, a, b *distlock.Client, rdb *redis.Client, prefix string) (holder *distlock.Lock, a1, a2 <-chan obtained) {
	t.Helper()
	holder, err := b.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	a1 = obtainAsync(ctx, a, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	a2 = obtainAsync(ctx, a, "job", time.Minute)
	waitDeferred(t, a, "job", 1)
	return holder, a1, a2
}

// When the key comes to a client, its turn begins: the waiters it has then
// get the key one after another, even while another client's waiter is
// queued; then the key goes to that other client, and a waiter that came
// during the turn waits for the next one.
func TestClientsTakeTurns(t *testing.T) {
	t.Parallel()
	a, b, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	holder, a1, a2 := queueBehind(ctx, t, a, b, rdb, prefix)
	a3 := obtainAsync(ctx, a, "job", time.Minute)
	waitDeferred(t, a, "job", 2)
	b1 := obtainAsync(ctx, b, "job", time.Minute)
	waitDeferred(t, b, "job", 1)
	waitListening(t, a)
	waitListening(t, b)

	l := handOver(ctx, t, holder, a1) // b's turn had nobody: a's begins, with a2 and a3
	require.Equal(t, int64(1), queued(t, rdb, prefix, "job"), "b's waiter queued behind a")
	a4 := obtainAsync(ctx, a, "job", time.Minute) // during a's turn: the next one
	waitDeferred(t, a, "job", 3)
	for i, next := range []<-chan obtained{a2, a3, b1, a4} {
		got := handOver(ctx, t, l, next)
		require.Greater(t, got.Fence(), l.Fence(), "hand-over %d", i)
		l = got
	}
	require.NoError(t, l.Release(ctx))
}

// A holder whose lock was lost while it had a waiter of its own client
// behind it, in its turn, hands that waiter nothing: its release reports the
// loss and leaves the new holder's lock alone, and the waiter gets the key
// once that holder lets go.
func TestTurnPassFromALostLock(t *testing.T) {
	t.Parallel()
	a, b, rdb, prefix := twoClients(t, distlock.Config{Recheck: 100 * time.Millisecond})
	ctx := t.Context()
	holder, a1, a2 := queueBehind(ctx, t, a, b, rdb, prefix)
	waitListening(t, a)
	l := handOver(ctx, t, holder, a1) // a's turn, with a2 in it

	// l's lease ran out and someone else took the key.
	stolen(t, rdb, prefix, "job")
	require.ErrorIs(t, l.Release(ctx), contend.ErrLockLost)
	stored, err := rdb.Get(ctx, lockKey(prefix, "job")).Result()
	require.NoError(t, err)
	require.Equal(t, "intruder", strings.TrimSuffix(stored, "|q"), "the release handed on a lock it did not hold")
	select {
	case got := <-a2:
		t.Fatalf("the waiter was handed a lock someone else holds: %v", got.err)
	case <-time.After(300 * time.Millisecond):
	}

	require.NoError(t, rdb.Del(ctx, lockKey(prefix, "job")).Err())
	got := receive(t, a2, 5*time.Second)
	require.NoError(t, got.err)
	require.Greater(t, got.l.Fence(), l.Fence())
	require.NoError(t, got.l.Release(ctx))
}

// A waiter's place in the queue lasts as long as its own lease, whatever
// the leases of the waiters of other clients: a client that rechecks often
// (and so renews its place with a short lease) and then gives up must not
// take the others' places with it.
func TestShortLeaseDoesNotExpireOthersPlaces(t *testing.T) {
	t.Parallel()
	slow, holding, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	fast := newClient(t, rdb, distlock.Config{Prefix: prefix, Recheck: 10 * time.Millisecond})
	later := newClient(t, rdb, distlock.Config{Prefix: prefix, Recheck: time.Minute})
	ctx := t.Context()
	holder, err := holding.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)

	first := obtainAsync(ctx, slow, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	fastCtx, cancel := context.WithCancel(ctx)
	gaveUp := obtainAsync(fastCtx, fast, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 2)
	cancel()
	require.ErrorIs(t, receive(t, gaveUp, 5*time.Second).err, context.Canceled)
	// Well past the fast client's waiter lease (three rechecks), well
	// within the slow one's.
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, int64(1), queued(t, rdb, prefix, "job"), "the first waiter's place expired with another's lease")
	second := obtainAsync(ctx, later, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 2)

	require.NoError(t, holder.Release(ctx))
	got := receive(t, first, 5*time.Second)
	require.NoError(t, got.err, "the first waiter lost its place")
	require.NoError(t, got.l.Release(ctx))
	got = receive(t, second, 5*time.Second)
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))
}

// A key whose holder's lease ran out while a waiter was queued is free, and
// a newcomer's take may get it; the lock it sets is marked, so that its
// release serves the queue at once, not at the waiter's next recheck.
func TestTakeBeforeAQueueServesItOnRelease(t *testing.T) {
	t.Parallel()
	c, other, rdb, prefix := twoClients(t, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	_, err := c.TryObtain(ctx, "job", time.Minute) // its holder dies
	require.NoError(t, err)
	waiter := obtainAsync(ctx, other, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	// The lease runs out once the waiter is queued: a short ttl would
	// let a waiter that is slow to start (a loaded machine) find the key
	// free and take it, queueing nothing.
	require.NoError(t, rdb.PExpire(ctx, lockKey(prefix, "job"), time.Millisecond).Err())
	require.Eventually(t, func() bool { return rdb.Exists(ctx, lockKey(prefix, "job")).Val() == 0 },
		5*time.Second, 5*time.Millisecond, "the lease did not run out")
	newcomer := newClient(t, rdb, distlock.Config{Prefix: prefix})
	l, err := newcomer.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	got := receive(t, waiter, 2*time.Second)
	require.NoError(t, got.err)
	require.Greater(t, got.l.Fence(), l.Fence())
	require.NoError(t, got.l.Release(ctx))
}

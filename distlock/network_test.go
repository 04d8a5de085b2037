package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/testserver"
)

// These tests put a TCP fault proxy between a Client and Redis, and use
// go-redis as users do: a client with its default options, which ignores
// ctx deadlines and re-sends a command after a read timeout, and, by
// onBothKinds, one built with ContextTimeoutEnabled, which the Client
// sends to on the caller's goroutine (the fast path). Each says which
// promise holds under its fault.

// onBothKinds runs test, in parallel, with opts for a go-redis client with
// its default options and for one with ContextTimeoutEnabled.
func onBothKinds(t *testing.T, test func(t *testing.T, opts redis.Options)) {
	for _, honours := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", honours), func(t *testing.T) {
			t.Parallel()
			test(t, redis.Options{ContextTimeoutEnabled: honours})
		})
	}
}

// behind returns a Client on a go-redis client that reaches Redis through
// a proxy of its own, and the proxy. opts tunes the go-redis client (its
// Addr is set here); the zero Options are go-redis's defaults. hooks are
// added to the go-redis client.
func behind(t *testing.T, rdb *redis.Client, opts redis.Options, cfg distlock.Config, hooks ...redis.Hook) (*distlock.Client, *faultproxy.Proxy) {
	t.Helper()
	proxy := faultproxy.Start(t, rdb.Options().Addr)
	opts.Addr = proxy.Addr()
	via := redis.NewClient(&opts)
	for _, h := range hooks {
		via.AddHook(h)
	}
	t.Cleanup(func() { via.Close() })
	c := newClient(t, via, cfg)
	require.Equal(t, opts.ContextTimeoutEnabled, distlock.FastPath(c))
	return c, proxy
}

// A holder cut off from Redis by a partition (nothing is forwarded, no
// connection is closed) is told, by its own timer, when its lock's
// validity passes: fn's ctx is cancelled with ErrLockLost while the
// refresh it sent is still waiting for an answer, which go-redis, with its
// default options, gives up on only after its read timeout (5s), long
// after another process took the key over.
//
// Each run checks that order of events, which no scheduling delay can
// turn around. How late the notice comes is checked over all runs, against
// a control beside each holder: a plain timer set for ValidUntil that
// cancels a context a goroutine waits on, the path the library's notice
// takes. The typical notice must come within 50ms of the typical control,
// and before the typical other process, polling Redis on a direct
// connection, obtains the key. One run's notice is not held to its own
// control: on a machine starved of CPU, goroutines that become runnable at
// the same moment run in an order the runtime picks, each a run-queue
// round after the one before, and at ValidUntil the library wakes several
// (its timer's, the abandoned refresh's, fn's) where the control wakes
// one. Nor is every run held to beat the other process: when this
// process's timers, the control's too, fire later than the drift allowance
// while the other process's clock is on time, that process takes the key
// first, the limit of any lease, which fencing tokens are for.
func TestPartitionedHolderIsToldInTime(t *testing.T) {
	t.Parallel()
	onBothKinds(t, partitionedHolders)
}

func partitionedHolders(t *testing.T, opts redis.Options) {
	const (
		runs   = 50
		batch  = 10 // runs at once, each with a proxy and a key of its own
		ttl    = time.Second
		within = 50 * time.Millisecond
	)
	rdb, prefix := testserver.Redis(t)
	other := newClient(t, rdb, distlock.Config{Prefix: prefix})
	lags, leads, lates := make([]time.Duration, runs), make([]time.Duration, runs), make([]time.Duration, runs)
	for first := 0; first < runs; first += batch {
		var wg sync.WaitGroup
		for i := first; i < first+batch; i++ {
			calls := new(redisCalls)
			holder, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix, TTL: ttl}, calls)
			wg.Go(func() {
				lags[i], leads[i], lates[i] = partitioned(t, holder, proxy, calls, other, fmt.Sprintf("job%d", i), !opts.ContextTimeoutEnabled)
			})
		}
		wg.Wait()
	}
	beyond := make([]time.Duration, runs)
	for i := range runs {
		beyond[i] = lags[i] - lates[i]
	}
	slices.Sort(lags)
	slices.Sort(leads)
	slices.Sort(lates)
	slices.Sort(beyond)
	t.Logf("%d partitions of a %v lease: told after ValidUntil by min %v, median %v, max %v (a plain timer: median %v, max %v; told after it: median %v, max %v); before the other process obtained by min %v, median %v",
		runs, ttl, lags[0], lags[runs/2], lags[runs-1], lates[runs/2], lates[runs-1], beyond[runs/2], beyond[runs-1], leads[0], leads[runs/2])
	require.Less(t, beyond[runs/2], within, "the typical holder was told later than a plain timer set for its ValidUntil fired")
	require.Positive(t, leads[runs/2], "the typical holder was told only after the other process had obtained the key")
}

// redisCalls is a go-redis hook that counts the calls still waiting for
// their answers, and the calls sent once watch was called.
type redisCalls struct {
	watching atomic.Bool
	sent     atomic.Int32
	waiting  atomic.Int32
}

// watch starts the count of calls sent.
func (c *redisCalls) watch() { c.watching.Store(true) }

// count runs a call through next.
func (c *redisCalls) count(next func() error) error {
	if c.watching.Load() {
		c.sent.Add(1)
	}
	c.waiting.Add(1)
	defer c.waiting.Add(-1)
	return next()
}

func (c *redisCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return c.count(func() error { return next(ctx, cmd) })
	}
}

func (c *redisCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return c.count(func() error { return next(ctx, cmds) })
	}
}

// partitioned cuts holder, a client behind proxy whose go-redis calls
// counts, off while it holds key, and checks that the holder is told it
// lost the lock while a refresh it sent is still waiting for its answer,
// if refreshStuck (on a client that ignores ctx deadlines).
// It returns how long after its ValidUntil the holder was told, how long
// before the other process obtained the key, and how late a goroutine woke
// on a context that a plain timer set for ValidUntil cancelled. It reports
// failures with t.Errorf: it runs on a goroutine of the test's.
func partitioned(t *testing.T, holder *distlock.Client, proxy *faultproxy.Proxy, calls *redisCalls, other *distlock.Client, key string, refreshStuck bool) (lag, lead, late time.Duration) {
	taken, fired := make(chan time.Time, 1), make(chan time.Time, 1)
	var valid, told time.Time
	err := holder.Do(t.Context(), key, func(ctx context.Context) error {
		calls.watch()
		l, _ := distlock.FromContext(ctx)
		// The control takes the path the library's notice takes: a timer
		// set for ValidUntil cancels a context, and a goroutine waiting on
		// it wakes.
		cctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Until(l.ValidUntil()), cancel)
		go func() { <-cctx.Done(); fired <- time.Now() }()
		proxy.Blackhole()
		go func() { taken <- poll(other, key) }()
		<-ctx.Done()
		told, valid = time.Now(), l.ValidUntil()
		sent, waiting := calls.sent.Load(), calls.waiting.Load()
		if !errors.Is(context.Cause(ctx), contend.ErrLockLost) {
			t.Errorf("%s: fn's ctx ended with %v", key, context.Cause(ctx))
		}
		// None sent happens only when this process is so starved that the
		// first refresh's timer fired past the validity too. A client that
		// honours ctx deadlines ends the refresh at the validity itself, as
		// the timer fires.
		if refreshStuck && sent > 0 && waiting == 0 {
			t.Errorf("%s: told only once every call to Redis sent while fn ran (%d) had returned", key, sent)
		}
		// Let the release through: its outcome is not what this test is
		// about. The reset ends the refresh go-redis is still waiting on.
		proxy.Heal()
		proxy.Reset()
		return nil
	})
	if !errors.Is(err, contend.ErrLockLost) {
		t.Errorf("%s: Do returned %v, not a lost lock", key, err)
	}
	obtained := <-taken
	if obtained.IsZero() {
		t.Errorf("%s: the other process never obtained the key", key)
	}
	select {
	case f := <-fired:
		late = max(f.Sub(valid), 0)
	case <-time.After(5 * time.Second): // fn never ran: reported above
	}
	return told.Sub(valid), obtained.Sub(told), late
}

// poll tries to obtain key every millisecond, for up to 5s, and returns
// when it did (the zero time if it never did); it lets the lock go at once.
func poll(c *distlock.Client, key string) time.Time {
	ctx := context.Background()
	for giveUp := time.Now().Add(5 * time.Second); time.Now().Before(giveUp); time.Sleep(time.Millisecond) {
		l, err := c.TryObtain(ctx, key, time.Minute)
		if err == nil {
			at := time.Now()
			_ = l.Release(ctx)
			return at
		}
	}
	return time.Time{}
}

// An obtain whose reply is lost after Redis ran it is sent again by
// go-redis: the second run finds the caller's own token and answers as the
// first did, with the same fencing token. The caller holds the lock; it
// is not told "busy" while its own lock blocks the key for a whole TTL.
func TestObtainSentTwiceIsOneLock(t *testing.T) {
	t.Parallel()
	onBothKinds(t, obtainSentTwice)
}

func obtainSentTwice(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	// A short read timeout (but one that a loaded machine's replies meet)
	// so that go-redis gives up on the lost reply,
	// and sends the script again, quickly; its retries are the default.
	opts.ReadTimeout = 500 * time.Millisecond
	c, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix})
	// With a deadline, on the fast path: go-redis's own timeout comes first.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	warm(t, c)

	proxy.DropNextReply()
	l, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err, "the obtain sent again found its own lock and called it busy")
	fence, err := rdb.Get(ctx, lockKey(prefix, "job")+":fence").Int64()
	require.NoError(t, err)
	require.Equal(t, fence, l.Fence(), "the second run moved the fencing counter")
	require.Equal(t, l.Token(), rdb.Get(ctx, lockKey(prefix, "job")).Val())
	require.NoError(t, l.Release(ctx))
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val())
}

// A release whose reply is lost is sent again: the second run finds the
// lock gone, with nobody having taken it since, and that is no loss.
func TestReleaseSentTwiceIsNotALoss(t *testing.T) {
	t.Parallel()
	onBothKinds(t, releaseSentTwice)
}

func releaseSentTwice(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	opts.ReadTimeout = 500 * time.Millisecond
	c, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix, NoWait: true})
	ctx := t.Context()
	warm(t, c)

	ran := false
	err := c.Do(ctx, "job", func(context.Context) error {
		ran = true
		proxy.DropNextReply() // the release's
		return nil
	})
	require.True(t, ran)
	require.NoError(t, err, "the release sent again reported the lock lost after fn succeeded")
	require.Zero(t, rdb.Exists(ctx, lockKey(prefix, "job")).Val())
}

// warm makes c load its scripts and open a connection, so that the next
// reply the proxy sees is the next call's.
func warm(t *testing.T, c *distlock.Client) {
	t.Helper()
	l, err := c.TryObtain(t.Context(), "warm", time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

// Connections reset under a holder (a failover, a load balancer dropping
// its flows) are no loss while the refreshes that go-redis re-sends on new
// connections arrive in time: fn runs to the end, undisturbed.
func TestResetConnectionsAreNotALoss(t *testing.T) {
	t.Parallel()
	onBothKinds(t, resetConnections)
}

func resetConnections(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	// Every refresh (each TTL/3) meets reset connections; the lease leaves
	// a loaded machine room for the reconnect's four round trips (at 900ms
	// it did not, once, in CI at load ~8: a refresh was still reconnecting
	// when the validity passed).
	c, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix, TTL: 1500 * time.Millisecond})
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		for range 20 {
			proxy.Reset()
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// On a slow link the holder's validity never runs past the lease Redis
// holds: it is counted from when each call was sent, not answered.
func TestLatencyNeverOverstatesTheLease(t *testing.T) {
	t.Parallel()
	onBothKinds(t, latency)
}

func latency(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	// The lease leaves room for a refresh delayed by a loaded machine:
	// what is checked is the validity, not the refreshes' punctuality.
	c, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix, TTL: time.Second})
	warm(t, c) // a new connection's handshake would take four round trips
	proxy.SetLatency(30 * time.Millisecond)
	checks := 0
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		l, _ := distlock.FromContext(ctx)
		for end := time.Now().Add(time.Second); time.Now().Before(end); checks++ {
			before := time.Now()
			mine := l.ValidUntil().Sub(before)
			left, err := rdb.PTTL(ctx, lockKey(prefix, "job")).Result()
			if err != nil {
				return err
			}
			// Redis's lease ends left after its answer, which came by
			// time.Now(); PTTL rounds down to the millisecond.
			if theirs := time.Since(before) + left + time.Millisecond; mine > theirs {
				return fmt.Errorf("valid for %v more here, %v in Redis", mine, theirs)
			}
		}
		return ctx.Err()
	})
	require.NoError(t, err)
	require.Positive(t, checks)
}

// On a network that stopped answering, Release returns within its bound
// (5s), with an error, although go-redis would wait longer; Close returns
// by its ctx's deadline, reporting the call still under way on a client
// that ignores ctx deadlines, and none on one that ended it by itself.
func TestReleaseIsBoundedOnAStuckNetwork(t *testing.T) {
	t.Parallel()
	onBothKinds(t, releaseOnAStuckNetwork)
}

func releaseOnAStuckNetwork(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	proxy := faultproxy.Start(t, rdb.Options().Addr)
	// Read timeouts of a minute: go-redis alone would wait that long.
	opts.Addr, opts.ReadTimeout, opts.WriteTimeout = proxy.Addr(), time.Minute, time.Minute
	via := redis.NewClient(&opts)
	t.Cleanup(func() { via.Close() })
	c, err := distlock.NewClient(via, distlock.Config{Prefix: prefix})
	require.NoError(t, err)
	ctx := t.Context()
	l, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	_ = l.Hold(ctx)

	proxy.Blackhole()
	began := time.Now()
	err = l.Release(ctx)
	took := time.Since(began)
	require.Error(t, err)
	require.Less(t, took, 6*time.Second, "Release waited for go-redis")
	t.Logf("Release on a stuck network returned after %v: %v", took, err)

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	began = time.Now()
	if opts.ContextTimeoutEnabled {
		// go-redis gave the call up at the release's deadline itself.
		require.NoError(t, c.Close(short), "a call is still under way")
	} else {
		require.Error(t, c.Close(short), "Close reports the call still under way")
	}
	require.Less(t, time.Since(began), time.Second)
	// The stuck call ends once the connection does.
	proxy.Heal()
	proxy.Reset()
	require.NoError(t, c.Close(ctx))
}

// A quorum node cut off by a partition counts as failed after NodeTimeout,
// although its default go-redis client would wait out its read timeout
// (5s): the majority's lock is granted within the timeout.
func TestQuorumNodeCutOffIsNotWaitedFor(t *testing.T) {
	t.Parallel()
	onBothKinds(t, quorumNodeCutOff)
}

func quorumNodeCutOff(t *testing.T, opts redis.Options) {
	// Well above a loaded machine's round trip through the proxies, well
	// below the read timeout the node's client would wait out.
	const nodeTimeout = 250 * time.Millisecond
	rdb, prefix := testserver.Redis(t)
	var nodes []redis.Scripter
	var proxies []*faultproxy.Proxy
	for db := range 3 { // three databases of one server stand in for three servers
		proxy := faultproxy.Start(t, rdb.Options().Addr)
		o := opts // go-redis keeps the pointer
		o.Addr, o.DB = proxy.Addr(), db
		node := redis.NewClient(&o)
		t.Cleanup(func() { node.Close() })
		nodes, proxies = append(nodes, node), append(proxies, proxy)
	}
	q, err := distlock.NewQuorum(nodes, distlock.QuorumConfig{Prefix: prefix, NodeTimeout: nodeTimeout})
	require.NoError(t, err)
	ctx := t.Context()
	// Warm every node's connection and script up. On a loaded machine the
	// first dial and script load through the proxies can take longer than
	// NodeTimeout, which is no cut-off node: try until one attempt goes
	// through.
	var l *distlock.Lock
	require.Eventually(t, func() bool {
		l, err = q.TryObtain(ctx, "warm", time.Minute)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "no warm-up attempt went through")
	require.NoError(t, l.Release(ctx))

	proxies[0].Blackhole()
	began := time.Now()
	l, err = q.TryObtain(ctx, "job", time.Minute)
	took := time.Since(began)
	require.NoError(t, err, "two of three nodes grant the lock")
	require.Less(t, took, 2*time.Second, "the attempt waited for the cut-off node")
	t.Logf("an attempt with a node cut off returned after %v (NodeTimeout %v)", took, nodeTimeout)
	proxies[0].Heal()
	proxies[0].Reset()
	require.NoError(t, l.Release(ctx))
	require.NoError(t, q.Close(ctx))
}

// Obtain, TryObtain and Do return by their ctx's deadline, with a little
// slack for the scheduler, whatever the network does: on a network that
// stopped answering, the clean-up of the call they gave up on (a leave, in
// case the script ran) goes on without them. Also a wait behind another
// client's lock, whose subscription cannot start, and calls that queue for
// a batch (a pipeline), more than the pool has connections; and a ctx that
// is only cancelled, which go-redis does not see.
func TestCallsReturnByTheirDeadlineOnASilentNetwork(t *testing.T) {
	t.Parallel()
	onBothKinds(t, silentNetwork)
}

func silentNetwork(t *testing.T, opts redis.Options) {
	rdb, prefix := testserver.Redis(t)
	opts.PoolSize = 2
	cfg := distlock.Config{Prefix: prefix}
	c, proxy := behind(t, rdb, opts, cfg)
	fresh, freshProxy := behind(t, rdb, opts, cfg) // it has never waited: no subscription yet
	held, err := newClient(t, rdb, cfg).TryObtain(t.Context(), "held", time.Minute)
	require.NoError(t, err)
	mine, err := fresh.TryObtain(t.Context(), "mine", time.Minute)
	require.NoError(t, err)
	warm(t, c)
	short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = c.Obtain(short, "held", time.Minute) // now c knows the key is busy: it queues at once
	cancel()
	require.ErrorIs(t, err, contend.ErrConflict)
	proxy.Blackhole()
	freshProxy.Blackhole()
	calls := map[string]func(ctx context.Context) error{
		"TryObtain": func(ctx context.Context) error { _, err := c.TryObtain(ctx, "job", time.Minute); return err },
		"Obtain":    func(ctx context.Context) error { _, err := c.Obtain(ctx, "job", time.Minute); return err },
		"Do": func(ctx context.Context) error {
			return c.Do(ctx, "job", func(context.Context) error { return nil })
		},
		"Obtain of a busy key": func(ctx context.Context) error { _, err := c.Obtain(ctx, "held", time.Minute); return err },
		"Obtain behind its own lock, subscribing": func(ctx context.Context) error {
			_, err := fresh.Obtain(ctx, "mine", time.Minute)
			return err
		},
		"8 TryObtains at once": func(ctx context.Context) error {
			errs := make([]error, 8)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { _, errs[i] = c.TryObtain(ctx, fmt.Sprintf("job%d", i), time.Minute) })
			}
			wg.Wait()
			for _, err := range errs {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					return err
				}
			}
			return errs[0]
		},
	}
	for name, call := range calls {
		for _, deadline := range []bool{true, false} {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			if !deadline {
				ctx, cancel = context.WithCancel(t.Context())
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			// A plain waiter on ctx tells how late this machine's
			// scheduler lets anyone see ctx end; the bound adds that lag.
			seen := make(chan time.Duration, 1)
			began := time.Now()
			go func() { <-ctx.Done(); seen <- time.Since(began) }()
			err := call(ctx)
			took := time.Since(began)
			cancel()
			lag := max(0, <-seen-100*time.Millisecond)
			// Not ctx.Err(): on a client that honours deadlines the read
			// may time out a moment before ctx's timer fires, and cancel
			// then makes ctx.Err() Canceled.
			want := context.DeadlineExceeded
			if !deadline {
				want = context.Canceled
			}
			require.ErrorIs(t, err, want, "%s (deadline %v)", name, deadline)
			require.Less(t, took, 350*time.Millisecond+lag, "%s (deadline %v) returned %v after its ctx ended (a plain waiter saw it end %v late)", name, deadline, took-100*time.Millisecond, lag)
		}
	}
	for _, p := range []*faultproxy.Proxy{proxy, freshProxy} {
		p.Heal()
		p.Reset()
	}
	require.NoError(t, held.Release(t.Context()))
	require.NoError(t, mine.Release(t.Context()))
}

package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

// ledger is a resource that checks fencing tokens: it takes a write only
// with a token larger than every one it has seen.
func ledger(t testing.TB) func(ctx context.Context, fence int64, writer string) (bool, error) {
	t.Helper()
	db := testserver.DB(t, "pgx")
	db.MustExec(`CREATE TABLE ledger (id text PRIMARY KEY, last_fence bigint NOT NULL, writer text NOT NULL)`)
	db.MustExec(`INSERT INTO ledger VALUES ('acct', 0, '')`)
	return func(ctx context.Context, fence int64, writer string) (bool, error) {
		return atomic.Update(ctx, db,
			`UPDATE ledger SET last_fence = $2, writer = $3 WHERE id = $1 AND last_fence < $2`, "acct", fence, writer)
	}
}

// The holder stalls past its TTL (a partition, or a frozen VM: nothing it
// sends reaches Redis, so the watchdog cannot refresh): fn's ctx is
// cancelled with ErrLockLost, another instance takes the lock with a larger
// fencing token and writes, and the stalled holder's late write with its
// old token is refused by the resource.
func TestHolderStalledPastItsTTL(t *testing.T) {
	t.Parallel()
	onBothKinds(t, stalledHolder)
}

func stalledHolder(t *testing.T, opts redis.Options) {
	write := ledger(t)
	rdb, prefix := testserver.Redis(t)
	lost := make(chan contend.Event, 1)
	stalled, proxy := behind(t, rdb, opts, distlock.Config{Prefix: prefix, TTL: 300 * time.Millisecond,
		Observer: contend.ObserverFunc(func(_ context.Context, e contend.Event) {
			if e.Kind == contend.EventLost {
				lost <- e
			}
		})})
	other := newClient(t, rdb, distlock.Config{Prefix: prefix, TTL: 5 * time.Second, Recheck: 50 * time.Millisecond})

	var cause, otherErr error
	var lateApplied bool
	err := stalled.Do(t.Context(), "acct", func(ctx context.Context) error {
		mine, _ := distlock.FromContext(ctx)
		proxy.Blackhole()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			// The Observer hears of it when fn does, not when Do returns.
			select {
			case e := <-lost:
				if !errors.Is(e.Err, contend.ErrLockLost) {
					return fmt.Errorf("EventLost with %v", e.Err)
				}
			case <-time.After(5 * time.Second):
				return errors.New("no EventLost while fn still runs")
			}
		case <-time.After(10 * time.Second):
			return errors.New("the stalled holder was never told")
		}
		// Meanwhile the lease ran out, and another instance took over.
		otherErr = other.Do(t.Context(), "acct", func(ctx context.Context) error {
			theirs, _ := distlock.FromContext(ctx)
			if theirs.Fence() <= mine.Fence() {
				return errors.New("the new holder's fencing token is not larger")
			}
			applied, err := write(ctx, theirs.Fence(), "other")
			if err == nil && !applied {
				err = errors.New("the new holder's write was refused")
			}
			return err
		})
		proxy.Heal()
		proxy.Reset()
		// The stalled holder wakes up and writes, late, as if it still held
		// the lock.
		var err error
		lateApplied, err = write(context.WithoutCancel(ctx), mine.Fence(), "stalled")
		return err
	})
	require.NoError(t, otherErr)
	require.ErrorIs(t, cause, contend.ErrLockLost, "fn's ctx is cancelled with ErrLockLost")
	require.ErrorIs(t, err, contend.ErrLockLost, "Do reports the loss")
	require.False(t, lateApplied, "the resource took a write with a stale fencing token")
}

// Redis restarts (and forgets every key) while a lock is held: the holder
// learns it lost the lock at its next refresh, the refresh does not take
// the key again, and the next holder's fencing token is still larger.
func TestRedisRestartedWhileHeld(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	c := newClient(t, rdb, distlock.Config{TTL: 600 * time.Millisecond, Recheck: 50 * time.Millisecond})
	ctx := t.Context()

	var before int64
	var cause error
	err := c.Do(ctx, "job", func(ctx context.Context) error {
		l, _ := distlock.FromContext(ctx)
		before = l.Fence()
		if err := srv.Restart(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("the holder was never told")
		}
	})
	require.ErrorIs(t, cause, contend.ErrLockLost)
	require.ErrorIs(t, err, contend.ErrLockLost)
	require.Zero(t, rdb.Exists(ctx, "distlock:{job}").Val(), "a refresh took the lost key again")

	l, err := c.Obtain(ctx, "job", time.Second)
	require.NoError(t, err)
	require.Greater(t, l.Fence(), before, "fencing tokens went back after the restart")
	require.NoError(t, l.Release(ctx))
}

// The client's subscription survives a restart: waiters are woken by grants
// again once it has reconnected.
func TestSubscriptionSurvivesARestart(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	c := newClient(t, rdb, distlock.Config{Recheck: time.Minute})
	other := newClient(t, rdb, distlock.Config{Recheck: time.Minute})
	ctx := t.Context()
	handOver := func() {
		holder, err := other.TryObtain(ctx, "job", time.Minute)
		require.NoError(t, err)
		w := obtainAsync(ctx, c, "job", time.Minute)
		waitQueued(t, rdb, "distlock:", "job", 1)
		require.NoError(t, holder.Release(ctx))
		got := receive(t, w, 10*time.Second) // the recheck is a minute: a grant woke it
		require.NoError(t, got.err)
		require.NoError(t, got.l.Release(ctx))
	}
	handOver()
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		chans, err := rdb.PubSubChannels(ctx, "distlock:grants:*").Result()
		return err == nil && len(chans) == 1 // only the waiters' client subscribes
	}, 10*time.Second, 10*time.Millisecond, "the subscription did not come back")
	handOver()
}

// A panic in fn releases the lock and is re-raised.
func TestPanicReleases(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_ = c.Do(t.Context(), "job", func(context.Context) error { panic("boom") })
	}()
	require.Equal(t, "boom", recovered)
	require.Zero(t, rdb.Exists(t.Context(), lockKey(prefix, "job")).Val(), "the panic left the lock held")
	l, err := c.TryObtain(t.Context(), "job", time.Second)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

// Nothing a call starts outlives it: not Do's watchdog, not a released
// lock's, not a wait's. (The client's subscription is the client's, and
// ends with Close; TestMain checks the whole package at the end.) Not
// parallel: other tests' goroutines would count.
func TestNoGoroutineLeftBehind(t *testing.T) {
	before := goleak.IgnoreCurrent()
	// A TTL that a loaded CI machine still refreshes in time (every ~170ms):
	// this test is about goroutines, not about losing the lock.
	c, _, _ := setup(t, distlock.Config{TTL: 500 * time.Millisecond})
	ctx := t.Context()
	// Subscribe first, by waiting once: that goroutine is the client's.
	warm, err := c.Obtain(ctx, "warm", time.Second)
	require.NoError(t, err)
	w := obtainAsync(ctx, c, "warm", time.Second)
	waitDeferred(t, c, "warm", 1)
	require.NoError(t, handOver(ctx, t, warm, w).Release(ctx))
	// The client's own: its subscription, and the goroutines that send its
	// calls, as many as were ever under way at once; Close ends them.
	withClient := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/contend/contend/internal/scriptbatch.(*Sender).worker")}

	require.NoError(t, c.Do(ctx, "job", func(ctx context.Context) error {
		// Long enough for the watchdog to refresh twice.
		time.Sleep(400 * time.Millisecond)
		return ctx.Err()
	}))
	goleak.VerifyNone(t, withClient...)

	l, err := c.Obtain(ctx, "job", time.Second)
	require.NoError(t, err)
	_ = l.Hold(ctx)
	w = obtainAsync(ctx, c, "job", time.Second)
	waitDeferred(t, c, "job", 1)
	require.NoError(t, handOver(ctx, t, l, w).Release(ctx))
	goleak.VerifyNone(t, withClient...)

	require.NoError(t, c.Close(ctx))
	goleak.VerifyNone(t, before)
}

// A holder whose Redis is down (every refresh refused at once) loses the
// lock when its validity passes, by the watchdog's timer, and the Observer hears
// of it then, while fn still runs: not only of the refreshes that failed.
func TestLossIsObservedWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	events := make(chan contend.Event, 64)
	c := newClient(t, rdb, distlock.Config{TTL: 300 * time.Millisecond, Observer: contend.ObserverFunc(func(_ context.Context, e contend.Event) {
		select {
		case events <- e:
		default:
		}
	})})
	err := c.Do(t.Context(), "job", func(ctx context.Context) error {
		require.NoError(t, srv.Stop())
		<-ctx.Done()
		for {
			select {
			case e := <-events:
				if e.Kind == contend.EventLost {
					if !errors.Is(e.Err, contend.ErrLockLost) {
						return fmt.Errorf("EventLost with %v", e.Err)
					}
					return nil
				}
			case <-time.After(5 * time.Second):
				return errors.New("no EventLost while fn still runs")
			}
		}
	})
	require.ErrorIs(t, err, contend.ErrLockLost)
	require.NotContains(t, err.Error(), "no EventLost")
	require.NoError(t, srv.Start())
}

// A Redis restarted from a snapshot older than the last acquisitions has
// a fencing counter set back; the tokens it hands out still exceed every
// one handed out before.
func TestFencesDoNotRepeatAfterARestartFromASnapshot(t *testing.T) {
	t.Parallel()
	srv := testserver.OwnRedis(t)
	rdb := srv.Client(t)
	c := newClient(t, rdb, distlock.Config{})
	ctx := t.Context()
	var last int64
	obtain := func() {
		l, err := c.TryObtain(ctx, "job", time.Minute)
		require.NoError(t, err)
		require.Greater(t, l.Fence(), last)
		last = l.Fence()
		require.NoError(t, l.Release(ctx))
	}
	obtain()
	require.NoError(t, rdb.Save(ctx).Err())
	for range 3 {
		obtain()
	}
	require.NoError(t, srv.Restart()) // from the snapshot: no save on shutdown
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 10*time.Second, 10*time.Millisecond)
	obtain()
}

// The two sources of a fencing token: the server's clock, in microseconds,
// when the counter is behind it (set back, as by an older snapshot), and one
// past the counter when the counter is not behind (a clock set back, or two
// acquisitions within a microsecond). Either way the counter keeps its day
// of life.
func TestFencesFollowTheCounterAndTheClock(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t, distlock.Config{})
	ctx := t.Context()
	counter := lockKey(prefix, "job") + ":fence"
	obtain := func() int64 {
		l, err := c.TryObtain(ctx, "job", time.Minute)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		ttl, err := rdb.PTTL(ctx, counter).Result()
		require.NoError(t, err)
		require.InDelta(t, 24*time.Hour, ttl, float64(time.Minute))
		return l.Fence()
	}

	require.NoError(t, rdb.Set(ctx, counter, 5, 0).Err())
	clock, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, obtain(), clock.UnixMicro(), "a counter set back gives way to the clock")

	ahead := clock.UnixMicro() + time.Hour.Microseconds()
	require.NoError(t, rdb.Set(ctx, counter, ahead, 0).Err())
	require.Equal(t, ahead+1, obtain(), "a counter ahead of the clock goes on from where it is")
	require.Equal(t, ahead+2, obtain())
	require.Equal(t, strconv.FormatInt(ahead+2, 10), rdb.Get(ctx, counter).Val())
}

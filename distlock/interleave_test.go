package distlock_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/testserver"
)

// A stall is a go-redis hook that holds back every call of one script
// whose arguments match, before it is sent (until the test closes send)
// and after it ran (until the test closes answer), so that a test can
// force the order in which Redis runs two goroutines' scripts, and in
// which their replies come back.
type stall struct {
	script  *redis.Script
	argv    func(argv []any) bool
	reached chan struct{} // closed when a matching call is about to be sent
	send    chan struct{}
	ran     chan struct{} // closed when a matching call has run
	answer  chan struct{}
	once    [2]sync.Once
}

func newStall(script *redis.Script, argv func([]any) bool) *stall {
	return &stall{
		script: script, argv: argv,
		reached: make(chan struct{}), send: make(chan struct{}),
		ran: make(chan struct{}), answer: make(chan struct{}),
	}
}

// open lets every matching call through at once.
func (s *stall) open() {
	close(s.send)
	close(s.answer)
}

func (s *stall) matches(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 3 {
		return false
	}
	switch name, _ := args[0].(string); name {
	case "evalsha":
		if args[1] != s.script.Hash() {
			return false
		}
	case "eval":
		body, _ := args[1].(string)
		sum := sha1.Sum([]byte(body))
		if hex.EncodeToString(sum[:]) != s.script.Hash() {
			return false
		}
	default:
		return false
	}
	n, _ := args[2].(int)
	return s.argv(args[3+n:])
}

func (s *stall) around(match bool, next func() error) error {
	if !match {
		return next()
	}
	s.once[0].Do(func() { close(s.reached) })
	<-s.send
	err := next()
	s.once[1].Do(func() { close(s.ran) })
	<-s.answer
	return err
}

func (s *stall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *stall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return s.around(s.matches(cmd), func() error { return next(ctx, cmd) })
	}
}

func (s *stall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		match := false
		for _, cmd := range cmds {
			match = match || s.matches(cmd)
		}
		return s.around(match, func() error { return next(ctx, cmds) })
	}
}

// arg reports whether argv[i] is v.
func arg(argv []any, i int, v string) bool { return len(argv) > i && fmt.Sprint(argv[i]) == v }

// hooked returns a client of its own on rdb's server, with hooks.
func hooked(t *testing.T, rdb *redis.Client, cfg distlock.Config, hooks ...redis.Hook) *distlock.Client {
	t.Helper()
	hc := redis.NewClient(testserver.RedisOptions(t))
	t.Cleanup(func() { _ = hc.Close() })
	for _, h := range hooks {
		hc.AddHook(h)
	}
	return newClient(t, hc, cfg)
}

// A waiter taken along by its head's release, whose ctx ends while that
// release is under way, never becomes this client's head: the release
// queued it in Redis after the waiter left, and a head that nobody is
// behind any more would make every later Obtain of the key in this client
// wait behind it until MaxWait, while the key is free.
func TestWaiterLeavingDuringItsHeadsReleaseIsNotTheHead(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	cfg := distlock.Config{Prefix: prefix, Recheck: 100 * time.Millisecond}
	ctx := t.Context()
	other := newClient(t, rdb, cfg)
	var holderTok atomic.Value
	holderTok.Store("")
	release := newStall(distlock.ReleaseScript, func(argv []any) bool { return arg(argv, 0, holderTok.Load().(string)) })
	c := hooked(t, rdb, cfg, release)

	holder, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	holderTok.Store(holder.Token())
	theirs := obtainAsync(ctx, other, "job", time.Minute)
	waitQueued(t, rdb, prefix, "job", 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mine := obtainAsync(wctx, c, "job", time.Minute)
	waitDeferred(t, c, "job", 1)
	waitListening(t, c)

	// The holder's release takes the waiter along, and queues it behind
	// the other process's waiter; before it reaches Redis, the waiter
	// gives up (and whatever leaving it does is done).
	released := make(chan error, 1)
	go func() { released <- holder.Release(ctx) }()
	receive(t, release.reached, 5*time.Second)
	cancel()
	require.ErrorIs(t, receive(t, mine, 5*time.Second).err, context.Canceled)
	release.open()
	require.NoError(t, receive(t, released, 5*time.Second))

	got := receive(t, theirs, 5*time.Second)
	require.NoError(t, got.err)
	require.NoError(t, got.l.Release(ctx))
	ctx2, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	again, err := c.Obtain(ctx2, "job", time.Minute)
	require.NoError(t, err, "the key is free, but this client waits behind a waiter that left")
	require.NoError(t, again.Release(ctx))
	waitQueued(t, rdb, prefix, "job", 0)
}

// A lock that a release in its client's turn passes to a waiter that is
// giving up is passed on, or released, by whoever learns of it first: it
// never stays with the departed waiter for its TTL. Here the waiter's ctx
// ends while the pass is on its way, and what leaving it does runs in
// Redis before the pass.
func TestPassToAWaiterGivingUpIsPassedOn(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	cfg := distlock.Config{Prefix: prefix, Recheck: time.Minute}
	ctx := t.Context()
	other := newClient(t, rdb, cfg)
	var passer atomic.Value
	passer.Store("")
	pass := newStall(distlock.PassScript, func(argv []any) bool { return arg(argv, 0, passer.Load().(string)) })
	leave := newStall(distlock.ReleaseScript, func(argv []any) bool { return arg(argv, 2, "1") })
	close(leave.send) // a leave runs at once; its reply waits
	c := hooked(t, rdb, cfg, pass, leave)

	first, err := c.TryObtain(ctx, "job", time.Minute)
	require.NoError(t, err)
	next := obtainAsync(ctx, c, "job", time.Minute)
	waitDeferred(t, c, "job", 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	last := obtainAsync(wctx, c, "job", time.Minute)
	waitDeferred(t, c, "job", 2)
	waitListening(t, c)
	holder := handOver(ctx, t, first, next)
	passer.Store(holder.Token())

	released := make(chan error, 1)
	go func() { released <- holder.Release(ctx) }()
	receive(t, pass.reached, 5*time.Second)
	cancel()
	select {
	case got := <-last:
		require.ErrorIs(t, got.err, context.Canceled)
		last = nil
	case <-leave.ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter neither returned nor left the queue")
	}
	pass.open()
	require.NoError(t, receive(t, released, 5*time.Second))
	close(leave.answer)
	if last != nil {
		require.ErrorIs(t, receive(t, last, 5*time.Second).err, context.Canceled)
	}
	require.Eventually(t, func() bool {
		l, err := other.TryObtain(ctx, "job", time.Minute)
		if err != nil {
			return false
		}
		require.NoError(t, l.Release(ctx))
		return true
	}, 2*time.Second, 10*time.Millisecond, "the lock stayed with the waiter that gave up")
}

// resend is a go-redis hook that does to a pipeline of take scripts what
// go-redis does after a read timeout: the pipeline ran, its reply is lost,
// and it is sent again, on the batch's ctx, which its callers' deadlines do
// not end. The re-send waits until again is closed.
type resend struct {
	again chan struct{}
	sent  chan struct{} // closed when the first send has run
	once  sync.Once
}

func (r *resend) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *resend) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (r *resend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	takes := newStall(distlock.TakeScript, func([]any) bool { return true })
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) < 2 || !takes.matches(cmds[0]) {
			return next(ctx, cmds)
		}
		err := next(ctx, cmds)
		r.once.Do(func() { close(r.sent) })
		<-r.again
		if again := next(ctx, cmds); again != nil {
			return again
		}
		return err
	}
}

// A batch of scripts whose reply was lost is sent again by go-redis, on a
// ctx its callers' deadlines do not end: the callers' clean-up is sent
// only when the batch has ended, so it runs in Redis after the re-send,
// and no lock is left behind for callers that have returned. (The
// scripts give the same answer when run twice; what they must not do is
// run after the clean-up.)
func TestResentBatchOfCallersWhoLeftIsCleanedUp(t *testing.T) {
	t.Parallel()
	rdb, prefix := testserver.Redis(t)
	cfg := distlock.Config{Prefix: prefix}
	ctx := t.Context()
	other := newClient(t, rdb, cfg)
	// Two sends at once at most (the pool's size), both held back, so
	// that the next calls queue and go out together as one pipeline.
	var blocked atomic.Int32
	block := newStall(distlock.TakeScript, func([]any) bool { return blocked.Add(1) <= 2 })
	close(block.answer)
	again := &resend{again: make(chan struct{}), sent: make(chan struct{})}
	opts := testserver.RedisOptions(t)
	opts.PoolSize = 2
	hc := redis.NewClient(opts)
	t.Cleanup(func() { _ = hc.Close() })
	hc.AddHook(block)
	hc.AddHook(again)
	c := newClient(t, hc, cfg)

	for _, key := range []string{"a", "b"} {
		go func() { _, _ = c.TryObtain(ctx, key, time.Minute) }()
	}
	require.Eventually(t, func() bool { return blocked.Load() >= 2 }, 5*time.Second, time.Millisecond)
	results := make(chan error, 2)
	for _, key := range []string{"job", "job2"} {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		t.Cleanup(cancel)
		go func() { _, err := c.TryObtain(short, key, time.Minute); results <- err }()
	}
	// Let both queue behind the held-back sends. If one has not, it goes
	// out alone, on its caller's ctx, and the test checks less, no more.
	time.Sleep(20 * time.Millisecond)
	close(block.send)
	receive(t, again.sent, 5*time.Second)
	for range 2 {
		require.ErrorIs(t, receive(t, results, 5*time.Second), context.DeadlineExceeded)
	}
	close(again.again)
	for _, key := range []string{"job", "job2"} {
		require.Eventually(t, func() bool {
			l, err := other.TryObtain(ctx, key, time.Minute)
			if err != nil {
				return false
			}
			require.NoError(t, l.Release(ctx))
			return true
		}, 2*time.Second, 10*time.Millisecond, "a lock was left to a caller that had returned")
	}
}

package distlock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keepalive"
	"github.com/contend/contend/internal/token"
)

// RedisClient is what a [Client] needs of go-redis: scripts, pipelines to
// send several together, and one subscription for the grants that hand a
// released lock to a waiter. [redis.UniversalClient] satisfies it (a single
// node, Sentinel or Cluster); tests wrap it to inject faults.
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Config configures a [Client]. The zero value is ready to use: every field
// has a documented default.
type Config struct {
	// Prefix is put before every key and channel the client makes, so that
	// locks of different applications sharing a Redis cannot collide.
	// Default: "distlock:".
	Prefix string
	// TTL is the lease of a lock that [Client.Do] takes; Do refreshes it
	// every TTL/3 while fn runs. A holder that crashes blocks the key for at
	// most this long. Redis counts in milliseconds: it is truncated to one.
	// Default: 10s; at least [MinTTL].
	TTL time.Duration
	// FailFast makes [Client.Do] give up at once, with an error matching
	// [contend.ErrConflict], when the key is held, as a cron job that only
	// one instance must run wants. Default: false, Do waits for the lock.
	FailFast bool
	// MaxWait bounds every wait for a held key (Obtain, and Do without
	// FailFast) when ctx allows longer, so that a stuck holder cannot make
	// callers without a deadline wait forever. Default: 30s.
	MaxWait time.Duration
	// Recheck is how often a waiter checks the lock by itself, in case the
	// message that grants it the lock was lost (a dropped subscription) or
	// the holder died without releasing. It also renews the waiter's place
	// in the queue, which lapses after three Rechecks without one (the
	// waiter's process died). Default: 500ms.
	Recheck time.Duration
	// GrantLease is how long a lock that another process's release hands
	// to one of this client's waiters stays the waiter's before it accepts
	// it (and extends it to its TTL); a hand-over within this client is for
	// the waiter's TTL at once.
	// It is short so that a waiter whose process died holds the key only
	// briefly; longer than Recheck so that a waiter whose grant message was
	// lost finds the grant still there when it checks. Default: 2 × Recheck,
	// and never more than the waiter's TTL.
	GrantLease time.Duration
	// Backoff paces a waiter's checks while the client cannot receive
	// grants (its subscription is down): jittered exponential backoff,
	// capped at Recheck. Its MaxAttempts is ignored: waits end with ctx or
	// MaxWait. Default: contend.Retry's defaults, MaxDelay at most Recheck.
	Backoff contend.Retry
	// Observe, when set, is called with every [Event]: obtains, wait times,
	// refresh failures, losses. It runs on the caller's or the watchdog's
	// goroutine and must not block. Default: nil, no events.
	Observe func(Event)
}

// Defaults of [Config].
const (
	DefaultPrefix  = "distlock:"
	DefaultTTL     = 10 * time.Second
	DefaultMaxWait = 30 * time.Second
	DefaultRecheck = 500 * time.Millisecond
)

// MinTTL is the shortest lease accepted. The watchdog refreshes every TTL/3,
// and each refresh is a round trip to Redis that must fit in that interval
// with room to retry.
const MinTTL = 10 * time.Millisecond

// releaseTimeout bounds the clean-up calls (release, leaving the queue) that
// must happen even when the caller's ctx has already ended.
const releaseTimeout = 5 * time.Second

// cleanupContext returns a context for a clean-up call that must run even
// when ctx has ended: ctx's values, without its cancellation, and a deadline
// releaseTimeout away, which go-redis turns into the deadline of the
// socket's reads and writes. Nothing else waits for it: a
// context.WithTimeout would start a timer for each release, and on a busy
// client those timers cost the runtime more than the release's own syscalls.
// It is context.WithoutCancel and the deadline in one value: one allocation
// per release, not two.
func cleanupContext(ctx context.Context) context.Context {
	return &deadlineContext{parent: ctx, deadline: time.Now().Add(releaseTimeout)}
}

type deadlineContext struct {
	parent   context.Context // for its values only
	deadline time.Time
}

func (c *deadlineContext) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *deadlineContext) Done() <-chan struct{}       { return nil }
func (c *deadlineContext) Err() error                  { return nil }
func (c *deadlineContext) Value(key any) any           { return c.parent.Value(key) }

// healthInterval is how long the subscription may stay silent before it is
// pinged, so that a connection that died without a reset is noticed.
const healthInterval = 5 * time.Second

// testHookDeferredWait, when set by a test, runs at the start of each turn
// of a deferred waiter's wait loop: it stands for the scheduler pausing the
// waiter there.
var testHookDeferredWait func()

// testHookHandedOver, when set by a test, runs when a release that handed
// the lock to a waiter of its client has its script's reply, before it
// tells the waiter: it stands for the scheduler pausing the releaser there.
var testHookHandedOver func()

// errMaxWait is the cause of a wait cut short by Config.MaxWait.
var errMaxWait = fmt.Errorf("distlock: waited Config.MaxWait: %w", context.DeadlineExceeded)

// ErrClosed reports a call on a [Client] after [Client.Close], or a wait that
// Close cut short.
var ErrClosed = errors.New("distlock: client closed")

func (cfg Config) withDefaults() (Config, error) {
	for name, d := range map[string]time.Duration{
		"TTL": cfg.TTL, "MaxWait": cfg.MaxWait, "Recheck": cfg.Recheck, "GrantLease": cfg.GrantLease,
	} {
		if d < 0 {
			return cfg, fmt.Errorf("distlock: Config.%s %v is negative: %w", name, d, contend.ErrInvalid)
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if err := checkTTL("Config.TTL", cfg.TTL); err != nil {
		return cfg, err
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = DefaultRecheck
	}
	if cfg.Recheck < time.Millisecond {
		return cfg, fmt.Errorf("distlock: Config.Recheck %v is below 1ms: %w", cfg.Recheck, contend.ErrInvalid)
	}
	if cfg.GrantLease == 0 {
		cfg.GrantLease = 2 * cfg.Recheck
	}
	if cfg.GrantLease < time.Millisecond {
		return cfg, fmt.Errorf("distlock: Config.GrantLease %v is below 1ms: %w", cfg.GrantLease, contend.ErrInvalid)
	}
	if cfg.Backoff.MaxDelay <= 0 || cfg.Backoff.MaxDelay > cfg.Recheck {
		cfg.Backoff.MaxDelay = min(contend.DefaultMaxDelay, cfg.Recheck)
	}
	return cfg, nil
}

func checkTTL(what string, ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("distlock: %s %v is below the minimum of %v: %w", what, ttl, MinTTL, contend.ErrInvalid)
	}
	return nil
}

func checkKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("distlock: %s: empty key: %w", op, contend.ErrInvalid)
	}
	return nil
}

// A Client takes locks on keys of one Redis deployment (a single node,
// Sentinel, or Cluster): mutual exclusion between every process that shares
// it, for as long as a lock's lease lasts.
//
// What is excluded: two holders of one key at once, while their leases run.
// A lease ends when it is released, or when its TTL passes without a
// refresh: a holder that crashes blocks the key for at most its TTL, and a
// holder that stalls past its TTL (a GC pause, a frozen VM) may still be
// working when the next one starts. [Client.Do] refreshes while fn runs and
// cancels fn's ctx with [contend.ErrLockLost] when it can no longer prove the
// lock held; fencing tokens ([Lock.Fence]) let the resource itself refuse a
// holder that outlived its lease. fn runs at most once per Do.
//
// Waiters are served in order: processes take turns in the order they
// queued, and a process's waiters get the key in the order they came (see
// the package doc). A release
// hands the lock straight to the next waiter and wakes only that waiter's
// process, through one subscription the Client owns (or, when the waiter is
// the releasing Client's own, from the release's reply, with no message at
// all). The Client never closes the Redis client it
// was given; [Client.Close] stops the subscription.
//
// A Client is safe for simultaneous use by multiple goroutines. Use one per
// process: every Client holds one subscription.
type Client struct {
	rdb     RedisClient
	cfg     Config
	channel string // where releases send this client's grants

	local [localShards]keyShard // what this client knows of its keys: see local.go
	seed  maphash.Seed
	batch batcher // scripts sent together: see batch.go
	holds keepalive.Timers

	mu      sync.Mutex                 // protects the fields below
	waiters map[string]*waiter         // by token
	sub     atomic.Pointer[subscriber] // nil until the first wait; set under mu
	closed  atomic.Bool                // set under mu; read without it on every obtain
	closing chan struct{}              // closed by Close
}

var _ contend.Guard = (*Client)(nil)

// NewClient returns a client that takes locks in rdb, configured by cfg. It
// fails with an error matching [contend.ErrInvalid] when rdb is nil or cfg
// has a bad value. It does not touch Redis; the first wait subscribes.
func NewClient(rdb RedisClient, cfg Config) (*Client, error) {
	if isNil(rdb) {
		return nil, fmt.Errorf("distlock: nil redis client: %w", contend.ErrInvalid)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Client{
		rdb:     rdb,
		cfg:     cfg,
		channel: cfg.Prefix + "grants:" + token.New(),
		seed:    maphash.MakeSeed(),
		waiters: map[string]*waiter{},
		closing: make(chan struct{}),
		batch:   batcher{limit: sendLimit(rdb)},
	}, nil
}

// keys returns the lock, fence, queue and waiter keys of key. They share the
// hash tag {key}, so a Cluster keeps them on one slot and one script can
// touch them all. They are cut from one string: one allocation, not four.
func (c *Client) keys(key string) []string {
	base := len(c.cfg.Prefix) + len(key) + 2
	var b strings.Builder
	b.Grow(3*base + len(":fence:queue:waiters"))
	for _, suffix := range []string{":fence", ":queue", ":waiters"} {
		b.WriteString(c.cfg.Prefix)
		b.WriteByte('{')
		b.WriteString(key)
		b.WriteByte('}')
		b.WriteString(suffix)
	}
	s := b.String()
	fence := base + len(":fence")
	queue := fence + base + len(":queue")
	return []string{s[:base], s[:fence], s[fence:queue], s[queue:]}
}

// TryObtain makes one attempt to lock key for ttl. It returns an error
// matching [contend.ErrConflict] at once when the key is held, and a Redis
// error as it is.
func (c *Client) TryObtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return c.obtain(ctx, key, ttl, false)
}

// Obtain locks key for ttl, waiting while it is held: in line behind earlier
// waiters, woken when the lock is handed to it. It gives up when ctx ends or
// Config.MaxWait passes, with an error matching both [contend.ErrConflict]
// and ctx's error ([context.Canceled] or [context.DeadlineExceeded]), after
// leaving the queue. A Redis error ends the wait too and is returned as it
// is. A lock handed over by another process's release is held at first for
// the grant lease and extended to ttl within a quarter of it unless released
// before (see [Lock.ValidUntil]); one handed over by this Client's own
// release is held for ttl at once. Most callers should use [Client.Do], which also
// refreshes and releases.
func (c *Client) Obtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return c.obtain(ctx, key, ttl, true)
}

// Do locks key for Config.TTL (waiting for it, unless Config.FailFast),
// runs fn, and releases the lock, also when fn fails or panics (the panic
// is re-raised). While fn runs, the lock is refreshed every TTL/3; when a
// refresh finds it gone, or its validity passes without a successful
// refresh, fn's ctx is cancelled with cause [contend.ErrLockLost] and Do's
// error matches ErrLockLost too, joined with fn's error: fn's work may have
// overlapped another holder's. fn finds the lock, and its fencing token,
// with [FromContext].
//
// Do returns fn's error unchanged, an error matching [contend.ErrConflict]
// when the key was held (at once with FailFast, else when the wait ended),
// ctx's error, or a Redis error.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if fn == nil {
		return fmt.Errorf("distlock: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	l, err := c.obtain(ctx, key, c.cfg.TTL, !c.cfg.FailFast)
	if err != nil {
		return err
	}
	return run(ctx, l, fn)
}

// Close stops the client's subscription and waits, until ctx ends, for its
// goroutine to finish. Waits in progress end with [ErrClosed]; locks already
// held stay valid and can still be released. Close is idempotent and works
// on a client that never subscribed. It does not close the Redis client.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed.Load() {
		c.closed.Store(true)
		close(c.closing)
		if s := c.sub.Load(); s != nil {
			close(s.stop)
		}
	}
	s := c.sub.Load()
	var ps *redis.PubSub
	if s != nil {
		ps = s.ps
	}
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	if ps != nil {
		// Unblocks the subscription's pending read.
		_ = ps.Close()
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("distlock: close: %w", context.Cause(ctx))
	}
}

func (c *Client) observe(e Event) {
	if c.cfg.Observe != nil {
		c.cfg.Observe(e)
	}
}

func (c *Client) isClosed() bool { return c.closed.Load() }

func (c *Client) obtain(ctx context.Context, key string, ttl time.Duration, wait bool) (*Lock, error) {
	if err := checkKey("obtain", key); err != nil {
		return nil, err
	}
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	ttl = ttl.Truncate(time.Millisecond)
	if c.isClosed() {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, ErrClosed)
	}
	if err := ctxErr(ctx); err != nil {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	keys := c.keys(key)
	tok := token.New()
	if wait {
		// Behind this client's head for the key, the waiter defers; else it
		// becomes the head, and on a key that made this client's last waiter
		// queue, it goes straight to the queue, without a take bound to fail.
		w, busy, err := c.enter(key, tok, ttl)
		if err != nil {
			return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
		}
		if w != nil || busy {
			return c.wait(ctx, key, keys, tok, ttl, w)
		}
	}
	l, err := c.take(ctx, key, keys, tok, ttl)
	if l == nil && err == nil && wait {
		return c.wait(ctx, key, keys, tok, ttl, nil)
	}
	switch {
	case err != nil:
		// The script may have run and only the reply been lost: let go of
		// whatever it may have taken rather than leave it for the TTL.
		c.leave(ctx, key, keys, tok)
		if cause := ctxErr(ctx); wait && cause != nil {
			// Obtain's ctx ended before it had the lock: a wait cut short,
			// whether or not it had begun.
			c.observe(Event{Kind: EventGaveUp, Key: key, Err: cause})
			return nil, fmt.Errorf("distlock: obtain %q: gave up: %w (%w)", key, contend.ErrConflict, cause)
		}
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	case l == nil:
		c.observe(Event{Kind: EventBusy, Key: key})
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, contend.ErrConflict)
	}
	c.held(key, tok, l.valid)
	c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence})
	return l, nil
}

// take is the common obtain, of a free key: a small script sets the lock
// if nobody holds it and moves the fencing counter, costing a fraction of
// what the acquire script does, and queues nothing (a missing counter is
// restarted: see runFenced). It returns nil when the key is held.
//
// A key whose holder's lease ran out while others were queued for it is
// free, and take gives it to the caller rather than to the oldest waiter:
// the one place a newcomer can go first. The waiters are served by the
// newcomer's release, or find the key free when they check.
func (c *Client) take(ctx context.Context, key string, keys []string, tok string, ttl time.Duration) (*Lock, error) {
	began := time.Now()
	fence, err := c.runFenced(ctx, takeScript, keys, tok, ttl.Milliseconds())
	switch {
	case err != nil:
		return nil, err // the caller's clean-up releases what it may have taken
	case fence == 0:
		return nil, nil // held
	}
	l := newLock(c, key, keys, tok, fence, ttl, began.Add(ttl))
	l.taken = true
	return l, nil
}

// attempt runs the acquire script once. It returns the lock when the caller
// holds it, nil when not. A waiter numbers its attempts from 1 in seq, and is
// queued by them; seq 0 tries once.
func (c *Client) attempt(ctx context.Context, key string, keys []string, tok string, ttl time.Duration, seq int64) (*Lock, error) {
	began := time.Now()
	mode := "0"
	if seq > 0 {
		mode = "1"
	}
	res, err := c.run(ctx, acquireScript, keys,
		tok, ttl.Milliseconds(), mode, c.channel,
		c.waiterLease().Milliseconds(), c.grantLease(ttl).Milliseconds(), seq,
	).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("distlock: unexpected reply %v from the acquire script", res)
	}
	if res[0] != 1 {
		return nil, nil
	}
	return newLock(c, key, keys, tok, res[1], ttl, began.Add(ttl)), nil
}

// grantLease is the lease of a lock handed to a waiter for ttl.
func (c *Client) grantLease(ttl time.Duration) time.Duration { return min(c.cfg.GrantLease, ttl) }

// wait obtains the lock as a queued waiter. A deferred waiter (w non-nil)
// is queued by the release of the lock it waits behind; any other is
// registered for its grant before the attempt that queues it is sent,
// because the grant can arrive before that attempt's reply.
func (c *Client) wait(ctx context.Context, key string, keys []string, tok string, ttl time.Duration, w *waiter) (l *Lock, err error) {
	began := time.Now()
	deferred := w != nil
	if !deferred {
		w = newWaiter(tok, ttl)
		if err := c.register(w); err != nil {
			return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
		}
	}
	defer c.unregister(tok)
	// queued: tok may be in Redis's queue or hold a grant, which leaving
	// must clean up, even though ctx may have ended: that may be why.
	queued := false
	defer func() {
		if l != nil {
			return
		}
		if deferred && c.undefer(key, w) {
			queued = true
		}
		if queued {
			c.leave(ctx, key, keys, tok)
		} else {
			// A head that never reached Redis: the waiters behind it must
			// not wait for it.
			c.released(key, tok, nil, "", time.Time{}, false)
		}
	}()
	s := c.subscriber()
	// A grant published before the subscription is confirmed would be lost:
	// the first waiters of a client wait for it, briefly. While the
	// subscription is down, waiters check on their own.
	if !s.healthy.Load() {
		t := time.NewTimer(c.cfg.Recheck)
		select {
		case <-s.settled:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	giveUpBy := began.Add(c.cfg.MaxWait)
	var giveUp error
	for seq := int64(1); ; seq++ {
		if deferred {
			seq = 1 // a release queues a deferred waiter, or hands it the lock, as attempt 1
		}
		if giveUp = ctxErr(ctx); giveUp != nil {
			break
		}
		if deferred && testHookDeferredWait != nil {
			testHookDeferredWait()
		}
		sentAt := time.Now()
		if !deferred {
			queued = true
			l, err := c.attempt(ctx, key, keys, tok, ttl, seq)
			if err != nil {
				if giveUp = ctxErr(ctx); giveUp != nil {
					break
				}
				return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
			}
			if l != nil {
				if seq == 1 {
					c.notBusy(key)
				}
				c.held(key, tok, l.valid)
				c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence, Waited: time.Since(began)})
				return l, nil
			}
			c.queuedHere(key, tok)
		}
		// Queued (or deferred): wait to be woken by a grant, or check again
		// after a while in case the grant's message was lost or the holder
		// died. The jitter keeps many waiters' checks from arriving together.
		delay := c.cfg.Recheck*4/5 + rand.N(c.cfg.Recheck*2/5+1)
		if !s.healthy.Load() {
			delay = max(c.cfg.Backoff.Delay(int(seq)), time.Millisecond)
		}
		t := time.NewTimer(min(delay, time.Until(giveUpBy)))
		var g grant
		select {
		case g = <-w.wake:
		case <-t.C:
			if !time.Now().Before(giveUpBy) {
				giveUp = errMaxWait
			}
		case <-ctx.Done():
			giveUp = ctxErr(ctx)
		case <-c.closing:
			giveUp = ErrClosed
		}
		t.Stop()
		if giveUp != nil {
			break
		}
		if g.seq == seq {
			if deferred && !g.local {
				// Queued by the release that took it along, not by an
				// attempt of its own: the grant is no older than that.
				sentAt = c.takenAt(key, w)
			}
			if l := c.accepted(key, keys, tok, ttl, g, sentAt); l != nil {
				c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence, Waited: time.Since(began)})
				return l, nil
			}
		}
		if deferred {
			stay, sent := c.stay(key, w)
			if stay {
				continue
			}
			// From now on, a waiter like any other: its next attempt
			// queues it, if a release has not.
			deferred, queued = false, sent
		}
	}
	c.observe(Event{Kind: EventGaveUp, Key: key, Waited: time.Since(began), Err: giveUp})
	if errors.Is(giveUp, ErrClosed) {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, giveUp)
	}
	return nil, fmt.Errorf("distlock: obtain %q: gave up waiting after %v: %w (%w)",
		key, time.Since(began).Round(time.Millisecond), contend.ErrConflict, giveUp)
}

// accepted returns the lock that grant g, made after the waiter's attempt
// sent at sentAt (or, for a deferred waiter, after the release that took it
// along began), hands to tok, or nil if the waiter must check with Redis.
//
// A grant from a release of this client's (local) is the full TTL, set by a
// release that began at g.at: the lock is valid from then, and held here
// already. Another process's grant is the short grant lease: it began no
// earlier than the attempt did, so it lasts at least until sentAt plus the
// lease, and the waiter holds the lock without another round trip and
// extends it to its TTL beside its work. Too little of that left, and the
// next attempt accepts (or finds a lapsed grant) the slow way.
func (c *Client) accepted(key string, keys []string, tok string, ttl time.Duration, g grant, sentAt time.Time) *Lock {
	if g.local {
		return newLock(c, key, keys, tok, g.fence, ttl, g.at.Add(ttl))
	}
	lease := c.grantLease(ttl)
	valid := sentAt.Add(lease)
	if time.Until(valid) < lease/2 {
		return nil
	}
	l := newLock(c, key, keys, tok, g.fence, ttl, valid)
	l.accept(valid)
	c.held(key, tok, valid)
	return l
}

// leave removes tok from key's queue and releases the lock if tok holds it,
// handing it to the next waiter: for a waiter that gives up, and for an
// attempt whose reply was lost. It runs even when ctx has ended; failures
// are left to the leases (the queue entry and the grant expire by
// themselves).
func (c *Client) leave(ctx context.Context, key string, keys []string, tok string) {
	first, inTurn := c.takeAlong(key, tok)
	_, _ = c.runRelease(cleanupContext(ctx), key, keys, tok, "1", first, inTurn)
}

// refresh, release and pttl make the Client a lockOwner.

func (c *Client) refresh(ctx context.Context, l *Lock, ttl time.Duration) (bool, error) {
	n, err := c.run(ctx, refreshScript, l.keys[:1], l.token, ttl.Milliseconds()).Int64()
	return n == 1, err
}

// release lets go of l, handing it to the oldest waiter if any. A lock taken
// while nobody waited most often finds nobody waiting still: a bare
// compare-and-delete frees it, and only when waiters came meanwhile (in
// Redis, which marks the lock, or deferred behind l here) does the release
// script run, to hand over.
func (c *Client) release(ctx context.Context, l *Lock) (bool, error) {
	first, inTurn := c.takeAlong(l.key, l.token)
	if l.taken && first == nil {
		n, err := c.run(ctx, freeScript, l.keys[:1], l.token).Int64()
		if err != nil || n != -1 {
			c.released(l.key, l.token, nil, "", time.Time{}, false)
			return n == 1, err
		}
	}
	return c.runRelease(ctx, l.key, l.keys, l.token, "0", first, inTurn)
}

// takeAlong returns the waiter deferred here behind tok that its release
// takes along (see runRelease), if any, and whether it is in this client's
// turn. None while the subscription is unconfirmed: a waiter taken along
// may be queued, and a grant published to it then would be lost.
func (c *Client) takeAlong(key, tok string) (*waiter, bool) {
	if !c.listening() {
		return nil, false
	}
	return c.releasing(key, tok)
}

// runRelease runs the release script for tok, the holder or a waiter
// giving up, and reports whether tok held the lock. first, the waiter that
// takeAlong gave, goes along: if the lock goes to another process's waiter,
// first is queued in Redis and the other waiters here defer behind it; if
// it goes to a waiter of this client (the oldest in Redis's queue, or
// first, in turn or when nobody is queued there), they all defer behind
// that one. A lock handed to a waiter of this client comes back as the
// grant message, without a publish: the release wakes the waiter itself.
func (c *Client) runRelease(ctx context.Context, key string, keys []string, tok, givingUp string, first *waiter, inTurn bool) (bool, error) {
	if first != nil && inTurn && givingUp == "0" {
		if held, err := c.pass(ctx, key, keys, tok, first); held || err != nil {
			return held, err
		}
		// tok no longer holds the lock: the release script finds out what
		// became of it, and what first should do.
	}
	args := []any{tok, givingUp, c.channel, c.waiterLease().Milliseconds()}
	if first != nil {
		turn := "0"
		if inTurn {
			turn = "1"
		}
		args = append(args, first.tok, c.grantLease(first.ttl).Milliseconds(), first.ttl.Milliseconds(), turn)
	}
	began := time.Now()
	res, err := c.run(ctx, releaseScript, keys, args...).Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("distlock: unexpected reply %v from the release script", res)
	}
	if err != nil {
		c.unsure(key, tok, first)
		return false, err
	}
	held, _ := res[0].(int64)
	msg, _ := res[1].(string)
	turnPass, _ := res[2].(int64)
	if msg == "" {
		c.released(key, tok, first, "", time.Time{}, false)
		return held == 1, nil
	}
	next, g := parseGrant(msg)
	c.handedOver(ctx, key, keys, tok, first, next, g, began, turnPass == 1)
	return held == 1, nil
}

// pass hands the lock from tok to first, its client's next waiter in its
// turn, by the pass script: the common hand-over on a key this client's
// goroutines share, at the cost of a take. It reports false, having
// changed nothing, when tok no longer holds the lock.
func (c *Client) pass(ctx context.Context, key string, keys []string, tok string, first *waiter) (bool, error) {
	began := time.Now()
	fence, err := c.runFenced(ctx, passScript, keys, tok, first.tok, first.ttl.Milliseconds())
	if err != nil {
		c.unsure(key, tok, first)
		return false, err
	}
	if fence == 0 {
		return false, nil
	}
	c.handedOver(ctx, key, keys, tok, first, first.tok, grant{seq: 1, fence: fence}, began, true)
	return true, nil
}

// runFenced runs script, a take or a pass, on the lock and fencing counter
// of keys. The script returns 0 when it changed nothing, else the fencing
// token it moved the counter to, where 1 means the counter was missing (a
// new key, or a Redis that lost its data): the fence script then restarts
// it from the server's clock, as the library's next_fence does.
func (c *Client) runFenced(ctx context.Context, script *redis.Script, keys []string, args ...any) (int64, error) {
	fence, err := c.run(ctx, script, keys[:2], args...).Int64()
	if err == nil && fence == 1 {
		fence, err = c.run(ctx, fenceScript, keys[:2]).Int64()
	}
	return fence, err
}

// unsure ends a release of tok whose script may or may not have run (its
// reply was an error): tok is no longer this client's head for key, and
// its waiters, first among them, check with Redis by themselves.
func (c *Client) unsure(key, tok string, first *waiter) {
	c.released(key, tok, nil, "", time.Time{}, false)
	if first != nil {
		wake(first, grant{})
	}
}

// handedOver ends tok's release, which handed the lock to next, a waiter
// of this client, at began: next holds it for its TTL from then, and is
// woken with g.
func (c *Client) handedOver(ctx context.Context, key string, keys []string, tok string, first *waiter, next string, g grant, began time.Time, inTurn bool) {
	if testHookHandedOver != nil {
		testHookHandedOver()
	}
	w := c.waiter(next)
	// A waiter no longer registered has given up, or it has found the
	// grant by an attempt of its own (a recheck while this release was
	// under way) and holds the lock: it recorded that, with held, before
	// it stopped waiting. Only the one that gave up left a lock nobody
	// holds, for this release to pass on; so did tok, if the grant was
	// its own.
	gaveUp := w == nil && (next == tok || !c.holding(key, next))
	until := began
	if w != nil {
		until = began.Add(w.ttl)
	}
	c.released(key, tok, first, next, until, inTurn)
	if gaveUp {
		c.leave(ctx, key, keys, next)
	} else if w != nil && g.fence > 0 {
		g.local, g.at = true, began
		wake(w, g)
		// Give the new holder this processor, as sync.Mutex's Unlock does
		// in its starvation mode: on a hot key the hand-over is what every
		// waiter waits for, and the woken goroutine would otherwise wait
		// until this one blocks, or for another thread to wake and steal it,
		// which on a VM can take longer than the round trip. The releaser,
		// done with the lock, runs again on the next free processor.
		runtime.Gosched()
	}
}

// waiterLease is how long a waiter's place in a queue lasts without being
// renewed: three rechecks.
func (c *Client) waiterLease() time.Duration { return 3 * c.cfg.Recheck }

func (c *Client) pttl(ctx context.Context, l *Lock) (time.Duration, bool, error) {
	n, err := c.run(ctx, pttlScript, l.keys[:1], l.token).Int64()
	if err != nil || n == -3 {
		return 0, false, err
	}
	return time.Duration(max(n, 0)) * time.Millisecond, true, nil
}

func (c *Client) margin(time.Duration) time.Duration { return 0 }

func (c *Client) holdTimers() *keepalive.Timers { return &c.holds }

// ctxErr returns ctx's error, with its cause when that says more, or nil.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	} else if cause != nil {
		return cause
	}
	return err
}

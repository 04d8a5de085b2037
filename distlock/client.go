package distlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/token"
)

// RedisClient is what a [Client] needs of go-redis: scripts, and one
// subscription for the grants that hand a released lock to a waiter. [redis.UniversalClient] satisfies it (a single
// node, Sentinel or Cluster); tests wrap it to inject faults.
type RedisClient interface {
	redis.Scripter
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
	// GrantLease is how long a lock handed to one of this client's waiters
	// stays the waiter's before it accepts it (and extends it to its TTL).
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

// healthInterval is how long the subscription may stay silent before it is
// pinged, so that a connection that died without a reset is noticed.
const healthInterval = 5 * time.Second

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
// Waiters are served in arrival order: a release hands the lock straight to
// the oldest waiter and wakes only that waiter's process, through one
// subscription the Client owns (or, when the waiter is the releasing
// Client's own, from the release's reply, with no message at all). The Client never closes the Redis client it
// was given; [Client.Close] stops the subscription.
//
// A Client is safe for simultaneous use by multiple goroutines. Use one per
// process: every Client holds one subscription.
type Client struct {
	rdb     RedisClient
	cfg     Config
	channel string // where releases send this client's grants

	mu      sync.Mutex              // protects the fields below
	waiters map[string]chan<- grant // token → its waiter's wake-up
	busy    map[string]struct{}     // keys whose last wait here queued: skip take
	sub     *subscriber             // nil until the first wait
	closed  atomic.Bool             // set under mu; read without it on every obtain
	closing chan struct{}           // closed by Close
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
		waiters: map[string]chan<- grant{},
		busy:    map[string]struct{}{},
		closing: make(chan struct{}),
	}, nil
}

// keys returns the lock, fence, queue and waiter keys of key. They share the
// hash tag {key}, so a Cluster keeps them on one slot and one script can
// touch them all.
func (c *Client) keys(key string) []string {
	base := c.cfg.Prefix + "{" + key + "}"
	return []string{base, base + ":fence", base + ":queue", base + ":waiters"}
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
// is. A lock handed over by a release is held at first for the grant lease
// and extended to ttl within a quarter of it unless released before (see
// [Lock.ValidUntil]). Most callers should use [Client.Do], which also
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
		if c.sub != nil {
			close(c.sub.stop)
		}
	}
	s := c.sub
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

// maxBusy bounds the keys a client remembers as busy; past it, it forgets
// them all, and they are learnt again.
const maxBusy = 1024

func (c *Client) isBusy(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.busy[key]
	return ok
}

// setBusy records whether a waiter for key had to queue: a key that did not
// is free again, and the next obtain tries the MULTI first.
func (c *Client) setBusy(key string, busy bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !busy {
		delete(c.busy, key)
		return
	}
	if len(c.busy) >= maxBusy {
		clear(c.busy)
	}
	c.busy[key] = struct{}{}
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
	// A key that made this client's last waiter queue is likely held still:
	// the waiter goes straight to the queue, without a MULTI bound to fail.
	if wait && c.isBusy(key) {
		return c.wait(ctx, key, keys, tok, ttl)
	}
	l, err := c.take(ctx, key, keys, tok, ttl)
	if l == nil && err == nil && wait {
		return c.wait(ctx, key, keys, tok, ttl)
	}
	switch {
	case err != nil:
		// The script may have run and only the reply been lost: let go of
		// whatever it may have taken rather than leave it for the TTL.
		c.leave(ctx, keys, tok)
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	case l == nil:
		c.observe(Event{Kind: EventBusy, Key: key})
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, contend.ErrConflict)
	}
	c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence})
	return l, nil
}

// take is the common obtain, of a free key: a small script sets the lock
// if nobody holds it and moves the fencing counter, costing a fraction of
// what the acquire script does, and queues nothing. A counter that was
// missing (the increment made it 1: a new key, or a Redis that lost its
// data) is restarted from the server's clock by the fence script, as the
// acquire script does. It returns nil when the key is held.
//
// A key whose holder's lease ran out while others were queued for it is
// free, and take gives it to the caller rather than to the oldest waiter:
// the one place a newcomer can go first. The waiters are served by the
// newcomer's release, or find the key free when they check.
func (c *Client) take(ctx context.Context, key string, keys []string, tok string, ttl time.Duration) (*Lock, error) {
	began := time.Now()
	fence, err := takeScript.Run(ctx, c.rdb, keys[:2], tok, ttl.Milliseconds()).Int64()
	switch {
	case err != nil:
		return nil, err
	case fence == 0:
		return nil, nil // held
	case fence == 1:
		if fence, err = fenceScript.Run(ctx, c.rdb, keys[:2]).Int64(); err != nil {
			return nil, err // the caller's clean-up releases the lock
		}
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
	res, err := acquireScript.Run(ctx, c.rdb, keys,
		tok, ttl.Milliseconds(), mode, c.channel,
		(3 * c.cfg.Recheck).Milliseconds(), c.grantLease(ttl).Milliseconds(), seq,
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

// wait obtains the lock as a queued waiter. The waiter is registered for its
// grant before the attempt that queues it is sent, because the grant can
// arrive before that attempt's reply.
func (c *Client) wait(ctx context.Context, key string, keys []string, tok string, ttl time.Duration) (l *Lock, err error) {
	began := time.Now()
	wake := make(chan grant, 1)
	s, err := c.register(tok, wake)
	if err != nil {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	defer c.unregister(tok)
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
	sent := false
	defer func() {
		if l == nil && sent {
			// Leave the queue, and pass on a grant that arrived meanwhile,
			// even though ctx may have ended: that is why we are leaving.
			c.leave(ctx, keys, tok)
		}
	}()
	var giveUp error
	for seq := int64(1); ; seq++ {
		if giveUp = ctxErr(ctx); giveUp != nil {
			break
		}
		sent = true
		sentAt := time.Now()
		l, err := c.attempt(ctx, key, keys, tok, ttl, seq)
		if err != nil {
			if giveUp = ctxErr(ctx); giveUp != nil {
				break
			}
			return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
		}
		if l != nil {
			if seq == 1 {
				c.setBusy(key, false)
			}
			c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence, Waited: time.Since(began)})
			return l, nil
		}
		if seq == 1 {
			c.setBusy(key, true)
			// Only now: most obtains never wait, and need no timer.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, c.cfg.MaxWait-time.Since(began), errMaxWait)
			defer cancel()
		}
		// Queued: wait to be woken by a grant, or check again after a while
		// in case the grant's message was lost or the holder died. The
		// jitter keeps many waiters' checks from arriving together.
		delay := c.cfg.Recheck*4/5 + rand.N(c.cfg.Recheck*2/5+1)
		if !s.healthy.Load() {
			delay = max(c.cfg.Backoff.Delay(int(seq)), time.Millisecond)
		}
		t := time.NewTimer(delay)
		var g grant
		select {
		case g = <-wake:
		case <-t.C:
		case <-ctx.Done():
		case <-c.closing:
			giveUp = ErrClosed
		}
		t.Stop()
		if giveUp != nil {
			break
		}
		// A grant made after this attempt (it carries its seq) began no
		// earlier than the attempt did, so its lease lasts at least until
		// sentAt plus the grant lease: the waiter holds the lock without
		// another round trip, and extends it to its TTL beside its work.
		// Too little of that left, or an older grant's message, and the next
		// attempt accepts (or finds a lapsed grant) the slow way.
		if g.seq == seq {
			lease := c.grantLease(ttl)
			if valid := sentAt.Add(lease); time.Until(valid) >= lease/2 {
				l := newLock(c, key, keys, tok, g.fence, ttl, valid)
				l.accept(valid)
				c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence, Waited: time.Since(began)})
				return l, nil
			}
		}
	}
	c.observe(Event{Kind: EventGaveUp, Key: key, Waited: time.Since(began), Err: giveUp})
	if errors.Is(giveUp, ErrClosed) {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, giveUp)
	}
	return nil, fmt.Errorf("distlock: obtain %q: gave up waiting after %v: %w (%w)",
		key, time.Since(began).Round(time.Millisecond), contend.ErrConflict, giveUp)
}

// leave removes tok from key's queue and releases the lock if tok holds it,
// handing it to the next waiter: for a waiter that gives up, and for an
// attempt whose reply was lost. It runs even when ctx has ended; failures
// are left to the leases (the queue entry and the grant expire by
// themselves).
func (c *Client) leave(ctx context.Context, keys []string, tok string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_, _ = c.runRelease(ctx, keys, tok, "1")
}

// refresh, release and pttl make the Client a lockOwner.

func (c *Client) refresh(ctx context.Context, l *Lock, ttl time.Duration) (bool, error) {
	n, err := refreshScript.Run(ctx, c.rdb, l.keys[:1], l.token, ttl.Milliseconds()).Int64()
	return n == 1, err
}

// release lets go of l, handing it to the oldest waiter if any. A lock taken
// while nobody waited most often finds nobody waiting still: a
// compare-and-delete that also checks the queue frees it, at little more
// than a bare release costs Redis, and only when waiters came meanwhile
// does the release script run, to hand it over.
func (c *Client) release(ctx context.Context, l *Lock) (bool, error) {
	if l.taken {
		n, err := freeScript.Run(ctx, c.rdb, []string{l.keys[0], l.keys[2]}, l.token).Int64()
		if err != nil || n != -1 {
			return n == 1, err
		}
	}
	return c.runRelease(ctx, l.keys, l.token, "0")
}

// runRelease runs the release script for tok and reports whether tok held
// the lock. A lock it hands to a waiter of this client comes back as the
// grant message, without a publish: the release wakes the waiter itself.
func (c *Client) runRelease(ctx context.Context, keys []string, tok, givingUp string) (bool, error) {
	res, err := releaseScript.Run(ctx, c.rdb, keys, tok, givingUp, c.channel).Result()
	if err != nil {
		return false, err
	}
	switch r := res.(type) {
	case int64:
		return r != 0, nil
	case string:
		c.wake(r)
		return true, nil
	}
	return false, fmt.Errorf("distlock: unexpected reply %v from the release script", res)
}

func (c *Client) pttl(ctx context.Context, l *Lock) (time.Duration, bool, error) {
	n, err := pttlScript.Run(ctx, c.rdb, l.keys[:1], l.token).Int64()
	if err != nil || n == -3 {
		return 0, false, err
	}
	return time.Duration(max(n, 0)) * time.Millisecond, true, nil
}

func (c *Client) margin(time.Duration) time.Duration { return 0 }

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

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
	"github.com/contend/contend/internal/scriptbatch"
	"github.com/contend/contend/internal/token"
)

// RedisClient is what a [Client] needs of go-redis: scripts, pipelines to
// send several together, and one subscription for the messages that tell a
// waiter a released lock is its turn. [redis.UniversalClient] satisfies it
// (a single node, Sentinel or Cluster).
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
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
// cancels fn's ctx with [contend.ErrLockLost] when the lock's validity
// passes without a successful refresh, on a timer, whatever the network is
// doing; fencing tokens ([Lock.Fence]) let the resource itself refuse a
// holder that outlived its lease. fn runs at most once per Do.
//
// Waiters are served in order: processes take turns in the order they
// queued, and a process's waiters get the key in the order they came (see
// the package doc). The Client never closes the Redis client it was given;
// [Client.Close] stops its subscription.
//
// A Client is safe for simultaneous use by multiple goroutines. Use one per
// process: every Client holds one subscription.
type Client struct {
	rdb     RedisClient
	cfg     Config
	channel string // where releases tell this client's waiters to look

	local [localShards]keyShard // what this client knows of its keys: see local.go
	seed  maphash.Seed
	calls *scriptbatch.Sender
	holds keepalive.Timers
	clock releaseClock

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
		calls:   scriptbatch.New(rdb, scriptbatch.Limit(rdb)),
		waiters: map[string]*waiter{},
		closing: make(chan struct{}),
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

// run runs script on keys, with the Redis calls of the client's other
// goroutines when they come together; it returns when ctx ends, if that
// comes first (see package scriptbatch).
func (c *Client) run(ctx context.Context, script *redis.Script, keys []string, argv []any) *redis.Cmd {
	return c.calls.Run(ctx, script, keys, argv...)
}

// TryObtain makes one attempt to lock key for ttl. It returns an error
// matching [contend.ErrConflict] at once when the key is held, and a Redis
// error as it is. It returns by ctx's deadline, whatever the network does.
func (c *Client) TryObtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return c.obtain(ctx, key, ttl, false)
}

// Obtain locks key for ttl, waiting while it is held: in line behind earlier
// waiters, woken when the lock is handed to it. It gives up when ctx ends or
// Config.MaxWait passes, with an error matching both [contend.ErrConflict]
// and ctx's error ([context.Canceled] or [context.DeadlineExceeded]), after
// leaving the queue. A Redis error ends the wait too and is returned as it
// is. Most callers should use [Client.Do], which also refreshes and
// releases.
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
// goroutine, and for Redis calls that callers stopped waiting for, to
// finish. Waits in progress end with [ErrClosed]; locks already held stay
// valid and can still be released. Close is idempotent and works on a
// client that never subscribed. It does not close the Redis client.
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
	if ps != nil {
		// Unblocks the subscription's pending read.
		_ = ps.Close()
	}
	if s != nil {
		select {
		case <-s.done:
		case <-ctx.Done():
			return fmt.Errorf("distlock: close: %w", context.Cause(ctx))
		}
	}
	if err := errors.Join(c.calls.Close(ctx), c.holds.Wait(ctx)); err != nil {
		return fmt.Errorf("distlock: close: %w", err)
	}
	return nil
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
		w, busy, err := c.join(key, tok, ttl)
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
	c.setHolder(key, tok, l.ValidUntil())
	c.observe(Event{Kind: EventObtained, Key: key, Fence: l.fence})
	return l, nil
}

// take is the common obtain, of a free key: a small script sets the lock
// if nobody holds it and moves the fencing counter, costing a fraction of
// what the acquire script does, and queues nothing. It returns nil when the
// key is held.
//
// A key whose holder's lease ran out while others were queued for it is
// free, and take gives it to the caller rather than to the oldest waiter:
// the one place a newcomer can go first. The waiters are served by the
// newcomer's release, or find the key free when they check.
func (c *Client) take(ctx context.Context, key string, keys []string, tok string, ttl time.Duration) (*Lock, error) {
	began := time.Now()
	fence, err := c.run(ctx, takeScript, keys[:2], takeArgs{token: tok, ttl: ttl}.argv()).Int64()
	switch {
	case err != nil:
		return nil, err // the caller's clean-up releases what it may have taken
	case fence == 0:
		return nil, nil // held
	}
	l := newLock(c, key, keys, tok, fence, ttl, c.validity(began, ttl))
	l.taken = true
	return l, nil
}

// attempt runs the acquire script once, queueing the caller if wait and
// the key is held. It returns the lock when the caller holds it, nil when
// not.
func (c *Client) attempt(ctx context.Context, key string, keys []string, tok string, ttl time.Duration, wait bool) (*Lock, error) {
	began := time.Now()
	res, err := c.run(ctx, acquireScript, keys, acquireArgs{
		token: tok, ttl: ttl, wait: wait, channel: c.channel,
		waiterLease: c.waiterLease(), grantLease: c.grantLease(ttl),
	}.argv()).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("distlock: unexpected reply %v from the acquire script", res)
	}
	if res[0] != 1 {
		return nil, nil
	}
	return newLock(c, key, keys, tok, res[1], ttl, c.validity(began, ttl)), nil
}

// grantLease is how long a release reserves the lock for a waiter for ttl
// of another process, until the waiter's attempt turns it into a hold.
func (c *Client) grantLease(ttl time.Duration) time.Duration { return min(c.cfg.GrantLease, ttl) }

// wait obtains the lock as a queued waiter. A deferred waiter (w non-nil)
// is queued by the release of the lock it waits behind; any other is
// registered for its wake before the attempt that queues it is sent,
// because the release that reserves the lock for it can come before that
// attempt's reply.
//
// A waiter holds the lock when an attempt of its own says so, or when a
// release of this client hands it over (the release's reply is Redis's
// word). A message from another process's release only makes it attempt at
// once: the attempt turns the reservation into a hold.
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
	// queued: tok may be in Redis's queue or hold the lock, which leaving
	// must clean up, even though ctx may have ended: that may be why.
	queued := false
	defer func() {
		if l == nil {
			c.stopWaiting(ctx, key, keys, w, deferred, queued)
		}
	}()
	s := c.subscriber()
	c.awaitSubscription(ctx, s)
	giveUpBy := began.Add(c.cfg.MaxWait)
	for attempts := 0; ; {
		if !deferred {
			if cause := ctxErr(ctx); cause != nil {
				return nil, c.gaveUp(key, began, cause)
			}
			queued = true
			attempts++
			l, err := c.attempt(ctx, key, keys, tok, ttl, true)
			if err != nil {
				if cause := ctxErr(ctx); cause != nil {
					return nil, c.gaveUp(key, began, cause)
				}
				return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
			}
			if l != nil {
				if attempts == 1 {
					c.clearBusy(key)
				}
				c.setHolder(key, tok, l.ValidUntil())
				return c.obtained(l, began), nil
			}
			c.setQueued(key, tok)
		}
		g, cause := c.sleep(ctx, s, w, attempts, giveUpBy)
		switch {
		case cause != nil:
			return nil, c.gaveUp(key, began, cause)
		case g.fence > 0: // handed over by a release here, already recorded
			return c.obtained(newLock(c, key, keys, tok, g.fence, ttl, c.validity(g.at, ttl)), began), nil
		case deferred:
			stay, sent := c.rejoin(key, w)
			// Unless it stays, from now on a waiter like any other: its
			// next attempt queues it, if a release has not.
			deferred, queued = stay, sent
		}
	}
}

// stopWaiting cleans up after w's wait for key ended without the lock. A
// waiter that may be in Redis's queue, or hold the lock there, leaves it;
// a head that never reached Redis lets the waiters behind it go, so that
// they do not wait for it.
func (c *Client) stopWaiting(ctx context.Context, key string, keys []string, w *waiter, deferred, queued bool) {
	if deferred && c.leaveLine(key, w) {
		queued = true
	}
	if queued {
		c.leave(ctx, key, keys, w.tok)
	} else {
		c.dropHead(key, w.tok)
	}
}

// obtained reports l, obtained by a wait that began at began.
func (c *Client) obtained(l *Lock, began time.Time) *Lock {
	c.observe(Event{Kind: EventObtained, Key: l.key, Fence: l.fence, Waited: time.Since(began)})
	return l
}

// awaitSubscription holds the first waiters of a client briefly until its
// subscription is confirmed: a message published before would be lost.
// While the subscription is down, waiters check on their own.
func (c *Client) awaitSubscription(ctx context.Context, s *subscriber) {
	if s.healthy.Load() {
		return
	}
	t := time.NewTimer(c.cfg.Recheck)
	defer t.Stop()
	select {
	case <-s.settled:
	case <-t.C:
	case <-ctx.Done():
	}
}

// sleep waits until w is woken, or until it is time to check the lock
// again in case the message was lost or the holder died (with jitter, so
// that many waiters' checks do not arrive together), and returns the
// grant, if any. It returns why the wait must end instead, if it must: ctx
// ended, MaxWait passed, or the client closed.
func (c *Client) sleep(ctx context.Context, s *subscriber, w *waiter, attempts int, giveUpBy time.Time) (grant, error) {
	delay := c.cfg.Recheck*4/5 + rand.N(c.cfg.Recheck*2/5+1)
	if !s.healthy.Load() {
		delay = max(c.cfg.Backoff.Delay(attempts), time.Millisecond)
	}
	t := time.NewTimer(min(delay, time.Until(giveUpBy)))
	defer t.Stop()
	select {
	case g := <-w.wake:
		return g, nil
	case <-t.C:
		if !time.Now().Before(giveUpBy) {
			return grant{}, errMaxWait
		}
		return grant{}, nil
	case <-ctx.Done():
		return grant{}, ctxErr(ctx)
	case <-c.closing:
		return grant{}, ErrClosed
	}
}

// gaveUp reports a wait for key that began at began and ended for cause.
func (c *Client) gaveUp(key string, began time.Time, cause error) error {
	c.observe(Event{Kind: EventGaveUp, Key: key, Waited: time.Since(began), Err: cause})
	if errors.Is(cause, ErrClosed) {
		return fmt.Errorf("distlock: obtain %q: %w", key, cause)
	}
	return fmt.Errorf("distlock: obtain %q: gave up waiting after %v: %w (%w)",
		key, time.Since(began).Round(time.Millisecond), contend.ErrConflict, cause)
}

// leave removes tok from key's queue and releases the lock if tok holds it
// (or it is reserved for tok), handing it to the next waiter: for a waiter
// that gives up, and for an attempt whose reply was lost. It runs even when
// ctx has ended; failures are left to the leases (the queue entry and the
// reservation expire by themselves).
func (c *Client) leave(ctx context.Context, key string, keys []string, tok string) {
	first, inTurn := c.takeAlong(key, tok)
	_, _ = c.runRelease(c.clock.context(ctx), key, keys, releaseArgs{token: tok, givingUp: true}, first, inTurn)
}

// refresh, release and pttl make the Client a lockOwner.

func (c *Client) refresh(ctx context.Context, l *Lock, ttl time.Duration) (bool, error) {
	n, err := c.run(ctx, refreshScript, l.keys[:2], refreshArgs{token: l.token, ttl: ttl}.argv()).Int64()
	return n == 1, err
}

// release lets go of l, handing it to the oldest waiter if any. A lock taken
// while nobody waited most often finds nobody waiting still: a bare
// compare-and-delete frees it, and only when waiters came meanwhile (in
// Redis, which marks the lock, or deferred behind l here) does the release
// script run, to hand over.
//
// A release that finds the lock neither held by l nor taken by anyone
// since (the counter still at l's fence) was sent again after a lost reply,
// or came after l's lease ran out with nobody waiting: it reports l held
// if it was sent within l's validity.
func (c *Client) release(ctx context.Context, l *Lock) (bool, error) {
	began := time.Now()
	gone := func(reply int64) bool {
		return reply == replyReleased || reply == replyGone && began.Before(l.ValidUntil())
	}
	first, inTurn := c.takeAlong(l.key, l.token)
	if l.taken && first == nil {
		n, err := c.run(ctx, freeScript, l.keys[:2], freeArgs{token: l.token, fence: l.fence}.argv()).Int64()
		if err != nil || n != replyQueued {
			c.dropHead(l.key, l.token)
			return gone(n), err
		}
	}
	reply, err := c.runRelease(ctx, l.key, l.keys, releaseArgs{token: l.token, fence: l.fence}, first, inTurn)
	return gone(reply), err
}

// takeAlong returns the waiter deferred here behind tok that its release
// takes along (see runRelease), if any, and whether it is in this client's
// turn. None while the subscription is unconfirmed: a waiter taken along
// may be queued, and a message published to it then would be lost.
func (c *Client) takeAlong(key, tok string) (*waiter, bool) {
	if !c.listening() {
		return nil, false
	}
	return c.beginRelease(key, tok)
}

// runRelease runs the release script for a.token, the holder or a waiter
// giving up, and returns what it says of the token's hold (see
// releaseArgs). first, the waiter that takeAlong gave, goes along: if the
// lock goes to another process's waiter, first is queued in Redis and the
// other waiters here defer behind it; if it goes to a waiter of this client
// (the oldest in Redis's queue, or first, in turn or when nobody is queued
// there), they all defer behind that one, which the release wakes itself.
func (c *Client) runRelease(ctx context.Context, key string, keys []string, a releaseArgs, first *waiter, inTurn bool) (int64, error) {
	if first != nil && inTurn && !a.givingUp {
		held, err := c.pass(ctx, key, keys, a.token, first)
		if err != nil {
			return replyNotHeld, err
		}
		if held {
			return replyReleased, nil
		}
		// a.token no longer holds the lock: the release script finds out
		// what became of it, and what first should do.
	}
	a.channel, a.waiterLease = c.channel, c.waiterLease()
	if first != nil {
		a.next, a.nextInTurn, a.nextGrant = first, inTurn, c.grantLease(first.ttl)
	}
	began := time.Now()
	res, err := c.run(ctx, releaseScript, keys, a.argv()).Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("distlock: unexpected reply %v from the release script", res)
	}
	if err != nil {
		c.unsure(key, a.token, first)
		return replyNotHeld, err
	}
	held, _ := res[0].(int64)
	msg, _ := res[1].(string)
	turnPass, _ := res[2].(int64)
	if msg == "" {
		c.endRelease(key, a.token, first, "", time.Time{}, false)
		return held, nil
	}
	next, g := parseGrant(msg)
	c.handedOver(ctx, key, keys, a.token, first, next, g, began, turnPass == 1)
	return held, nil
}

// pass hands the lock from tok to first, its client's next waiter in its
// turn, by the pass script: the common hand-over on a key this client's
// goroutines share, at the cost of a take. It reports false, having
// changed nothing, when tok no longer holds the lock.
func (c *Client) pass(ctx context.Context, key string, keys []string, tok string, first *waiter) (bool, error) {
	began := time.Now()
	fence, err := c.run(ctx, passScript, keys[:2], passArgs{holder: tok, next: first.tok, nextTTL: first.ttl}.argv()).Int64()
	if err != nil {
		c.unsure(key, tok, first)
		return false, err
	}
	if fence == 0 {
		return false, nil
	}
	c.handedOver(ctx, key, keys, tok, first, first.tok, grant{fence: fence}, began, true)
	return true, nil
}

// unsure ends a release of tok whose script may or may not have run (its
// reply was an error): tok is no longer this client's head for key, and
// its waiters, first among them, check with Redis by themselves.
func (c *Client) unsure(key, tok string, first *waiter) {
	c.dropHead(key, tok)
	if first != nil {
		wake(first, grant{})
	}
}

// handedOver ends tok's release, which handed the lock to next, a waiter
// of this client, at began: next holds it for its TTL from then, and is
// woken with g.
func (c *Client) handedOver(ctx context.Context, key string, keys []string, tok string, first *waiter, next string, g grant, began time.Time, inTurn bool) {
	w := c.waiter(next)
	// A waiter no longer registered has given up, or it has found the
	// lock by an attempt of its own (a recheck while this release was
	// under way) and holds it: it recorded that, with setHolder, before it
	// stopped waiting. Only the one that gave up left a lock nobody
	// holds, for this release to pass on; so did tok, if the grant was
	// its own.
	gaveUp := w == nil && (next == tok || !c.isHolder(key, next))
	until := began
	if w != nil {
		until = c.validity(began, w.ttl)
	}
	c.endRelease(key, tok, first, next, until, inTurn)
	if gaveUp {
		c.leave(ctx, key, keys, next)
	} else if w != nil {
		g.at = began
		wake(w, g)
		// Give the new holder this processor, as sync.Mutex's Unlock does
		// in its starvation mode: on a hot key the hand-over is what every
		// waiter waits for, and the woken goroutine would otherwise wait
		// until this one blocks, or for another thread to wake and steal it.
		// The releaser, done with the lock, runs again on the next free
		// processor.
		runtime.Gosched()
	}
}

// waiterLease is how long a waiter's place in a queue lasts without being
// renewed: three rechecks.
func (c *Client) waiterLease() time.Duration { return 3 * c.cfg.Recheck }

func (c *Client) pttl(ctx context.Context, l *Lock) (time.Duration, bool, error) {
	n, err := c.run(ctx, pttlScript, l.keys[:1], []any{l.token}).Int64()
	if err != nil || n == -3 {
		return 0, false, err
	}
	return time.Duration(max(n, 0)) * time.Millisecond, true, nil
}

// margin allows for this process's clock running slower than Redis's: a
// lease that Redis ends after ttl by its clock may have lasted ttl less the
// margin by this one's (see [Lock.ValidUntil]).
func (c *Client) margin(ttl time.Duration) time.Duration { return driftMargin(ttl, DefaultDriftFactor) }

// validity is the deadline of a lease of ttl granted by a call that began
// at began.
func (c *Client) validity(began time.Time, ttl time.Duration) time.Time {
	return began.Add(ttl - c.margin(ttl))
}

func (c *Client) holdTimers() *keepalive.Timers { return &c.holds }

func (c *Client) releaseContext(ctx context.Context) context.Context { return c.clock.context(ctx) }

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

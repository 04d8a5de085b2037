package distlock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
	"github.com/contend/contend/internal/inflight"
	"github.com/contend/contend/internal/scriptbatch"
	"github.com/contend/contend/internal/token"
)

// RedisClient is what a [Client] needs of go-redis: scripts, pipelines to
// send several together, and one subscription for the messages that tell a
// waiter a released lock is its turn. [redis.UniversalClient] satisfies it
// (a single node, Sentinel or Cluster).
type RedisClient interface {
	redis.Scripter
	// Pipeline sends several commands in one round trip.
	Pipeline() redis.Pipeliner
	// Subscribe listens on channels, for the messages of released locks.
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
	base
	rdb     RedisClient
	cfg     Config
	channel string // where releases tell this client's waiters to look

	local [localShards]keyShard // what this client knows of its keys: see line.go
	seed  maphash.Seed
	calls *scriptbatch.Sender
	// cleanups counts the leaves under way that no caller waits for.
	cleanups inflight.Group

	mu      sync.Mutex                 // protects the fields below
	waiters map[string]*waiter         // by token: whom a release's message wakes, no more
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
		base:    base{drift: defaultDriftFactor, observer: cfg.Observer},
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
// touch them all. They are cut from one string: one allocation, not four,
// and kept in into.
func (c *Client) keys(key string, into *[4]string) []string {
	p := c.cfg.Prefix
	s := p + "{" + key + "}:fence" + p + "{" + key + "}:queue" + p + "{" + key + "}:waiters" // one concatenation
	lock := len(p) + len(key) + 2
	fence := lock + len(":fence")
	queue := fence + lock + len(":queue")
	*into = [4]string{s[:lock], s[:fence], s[fence:queue], s[queue:]}
	return into[:]
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
// and ctx's error ([context.Canceled] or [context.DeadlineExceeded]) at
// once; its place in the queue, and a lock handed to it meanwhile, are given
// up by the Client in the background, which [Client.Close] waits for. A Redis error ends the wait too and is returned as it
// is. Most callers should use [Client.Do], which also refreshes and
// releases.
func (c *Client) Obtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return c.obtain(ctx, key, ttl, true)
}

// Do locks key for Config.TTL (waiting for it, unless Config.NoWait),
// runs fn, and releases the lock, also when fn fails or panics (the panic
// is re-raised). While fn runs, the lock is refreshed every TTL/3; when a
// refresh finds it gone, or its validity passes without a successful
// refresh, fn's ctx is cancelled with cause [contend.ErrLockLost] and Do's
// error matches ErrLockLost too, joined with fn's error: fn's work may have
// overlapped another holder's. fn finds the lock, and its fencing token,
// with [FromContext].
//
// Do returns fn's error unchanged, an error matching [contend.ErrConflict]
// when the key was held (at once with NoWait, else when the wait ended),
// ctx's error, or a Redis error.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	return do(ctx, key, fn, func() (*Lock, error) { return c.obtain(ctx, key, c.cfg.TTL, !c.cfg.NoWait) })
}

// Close stops the client's subscription and waits, until ctx ends, for its
// goroutine, for the waits it ends and the clean-up in Redis of callers
// who gave up, and for Redis calls that callers stopped waiting for, to
// finish. Waits in progress end with [contend.ErrClosed]; locks already held stay
// valid and can still be released. Close is idempotent and works on a
// client that never subscribed. It does not close the Redis client.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed.Swap(true) {
		close(c.closing)
	}
	s := c.sub.Load()
	c.mu.Unlock()
	if s != nil {
		// s.ps was set under mu, and no later one will be (subscribe
		// finds the client closed).
		if s.ps != nil {
			_ = s.ps.Close() // unblocks the subscription's pending read
		}
		select {
		case <-s.done:
		case <-ctx.Done():
			return fmt.Errorf("distlock: close: %w", context.Cause(ctx))
		}
	}
	cleanups := c.cleanups.Wait(ctx)
	if cleanups != nil {
		cleanups = fmt.Errorf("clean-ups still under way: %w", cleanups)
	}
	if err := errors.Join(cleanups, c.calls.Close(ctx), c.holds.Wait(ctx)); err != nil {
		return fmt.Errorf("distlock: close: %w", err)
	}
	return nil
}

func (c *Client) obtain(ctx context.Context, key string, ttl time.Duration, wait bool) (*Lock, error) {
	ttl, err := checkObtain(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if c.closed.Load() {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, contend.ErrClosed)
	}
	w := &waiter{tok: token.New(), ttl: ttl}
	keys := c.keys(key, &w.keys)
	if wait {
		// Behind this client's head for the key, the waiter defers; else it
		// becomes the head, and on a key that made this client's last waiter
		// queue, it goes straight to the queue, without a take bound to fail.
		var deferred, busy bool
		c.onLine(key, func(l *line) {
			w.wake = make(chan grant, 1)
			deferred, busy, _ = l.join(w, time.Now())
		})
		if deferred || busy {
			return c.wait(ctx, key, keys, w, !deferred, 0)
		}
	}
	l, err := c.try(ctx, key, keys, w, false)
	switch {
	case err != nil:
		// The script may have run and only the reply been lost: let go of
		// whatever it may have taken rather than leave it for the TTL.
		c.depart(ctx, key, keys, w)
		if cause := ctxerr.Of(ctx); wait && cause != nil {
			// Obtain's ctx ended before it had the lock: a wait cut short,
			// whether or not it had begun.
			err = fmt.Errorf("distlock: obtain %q: gave up: %w (%w)", key, contend.ErrConflict, cause)
			reportMiss(ctx, c.observer, contend.EventGaveUp, key, time.Time{}, 1, err)
			return nil, err
		}
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	case l == nil && wait:
		return c.wait(ctx, key, keys, w, true, 1)
	case l == nil:
		err := fmt.Errorf("distlock: obtain %q: %w", key, contend.ErrConflict)
		reportMiss(ctx, c.observer, contend.EventConflict, key, time.Time{}, 1, err)
		return nil, err
	}
	c.onLine(key, func(ln *line) { ln.obtained(w, l.ValidUntil(), false) })
	// The take's attempt began when the call did, give or take the checks.
	l.reportObtained(ctx, l.ValidUntil().Add(-(ttl - c.margin(ttl))), 1)
	return l, nil
}

// try makes one attempt for w, whose last call it is, and returns the lock
// when w holds it, nil when not. Both scripts answer with w's fencing token
// when it holds the lock, 0 when not.
//
// Without queue it is the common obtain, of a free key: take.lua sets the
// lock if nobody holds it and moves the fencing counter, costing a fraction
// of what the acquire script does, and queues nothing. A key whose holder's
// lease ran out while others were queued for it is free, and take gives it
// to the caller rather than to the oldest waiter: the one place a newcomer
// can go first. The lock is then marked taken, so that the newcomer's
// release serves the waiters. On an error, the caller's clean-up releases
// what it may have taken.
//
// With queue, acquire.lua queues w if the key is held. Its arguments: the
// waiter's token and TTL, where a release tells it to look, how long its
// place in the queue lasts, and the grant lease it asks for.
func (c *Client) try(ctx context.Context, key string, keys []string, w *waiter, queue bool) (*Lock, error) {
	script, scriptKeys, args := takeScript, keys[:3], leaseArgs(w.tok, w.ttl)
	if queue {
		script, scriptKeys = acquireScript, keys
		args = []any{w.tok, ms(w.ttl), "1", c.channel, ms(c.waiterLease()), ms(c.grantLease(w.ttl))}
	}
	began := time.Now()
	cmd, ended := c.calls.Start(ctx, script, scriptKeys, args...)
	w.ended = ended
	fence, err := cmd.Int64()
	if err != nil || fence == 0 {
		return nil, err
	}
	l := newLock(c, &c.base, key, keys, w.tok, fence, w.ttl, c.validity(began, w.ttl))
	l.taken = !queue
	return l, nil
}

// refresh, release and pttl make the Client a lockOwner.

func (c *Client) refresh(ctx context.Context, l *Lock, ttl time.Duration) (bool, error) {
	n, err := c.calls.Run(ctx, refreshScript, l.keys[:2], leaseArgs(l.token, ttl)...).Int64()
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
	along, inTurn := c.takeAlong(l.key, l.token)
	if l.taken && along == nil {
		n, err := c.calls.Run(ctx, freeScript, l.keys[:2], l.token, l.fence).Int64()
		if err != nil || n != replyQueued {
			c.endRelease(ctx, l.key, l.keys, l.token, nil, outcome{lost: err != nil}, nil)
			return gone(n), err
		}
	}
	reply, err := c.runRelease(ctx, l.key, l.keys, l.token, l.fence, along, inTurn)
	return gone(reply), err
}

func (c *Client) pttl(ctx context.Context, l *Lock) (time.Duration, bool, error) {
	n, err := c.calls.Run(ctx, pttlScript, l.keys[:1], l.token).Int64()
	if err != nil || n == -3 {
		return 0, false, err
	}
	return time.Duration(max(n, 0)) * time.Millisecond, true, nil
}

// validity is the deadline of a lease of ttl granted by a call that began
// at began.
func (c *Client) validity(began time.Time, ttl time.Duration) time.Time {
	return began.Add(ttl - c.margin(ttl))
}

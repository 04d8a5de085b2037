package distlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
)

// The Client's side of its lines (line.go): it asks a key's line, sends
// what the line says to Redis, and reports the reply back. First the
// waiter's side: an Obtain that found the key held waits in line, here or
// in Redis, until a release hands it the lock or its own attempt finds it
// free or reserved for it. Then the releaser's: hand-overs take along the
// first waiter deferred behind the releaser here, in this client's turn by
// pass.lua without a look at Redis's queue, else by release.lua.

// wait obtains the lock as a waiter w that joined key's line: deferred
// there, or asking Redis (attempt), whose attempt queues it if the key is
// held. w is registered for its wake before the attempt that queues it is
// sent, because the release that reserves the lock for it can come before
// that attempt's reply.
//
// A waiter holds the lock when an attempt of its own says so, or when a
// release of this client hands it over (the release's reply is Redis's
// word). A message from another process's release only makes it attempt at
// once: the attempt turns the reservation into a hold.
//
// tries counts the attempts the caller made before the wait, for the
// events.
func (c *Client) wait(ctx context.Context, key string, keys []string, w *waiter, attempt bool, tries int) (l *Lock, err error) {
	began := time.Now()
	// Close waits for the wait to end, and for the clean-up it starts.
	c.cleanups.Add()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, w.tok) // no more wake-ups
		c.mu.Unlock()
		if l == nil {
			// w departs: whatever it may have in Redis is given up once its
			// last call has ended, even though ctx may have ended: that
			// may be why.
			c.step(ctx, key, keys, w.ended, func(ln *line) (step, bool) { return ln.depart(w) })
		}
		c.cleanups.Done()
	}()
	s, err := c.register(w)
	if err != nil {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	c.awaitSubscription(ctx, s)
	giveUpBy := began.Add(c.cfg.MaxWait)
	for attempts := 0; ; {
		if attempt {
			if cause := ctxerr.Of(ctx); cause != nil {
				return nil, gaveUp(ctx, c.observer, key, began, tries+attempts, cause)
			}
			attempts++
			if l, err := c.attemptInLine(ctx, key, keys, w, began, tries+attempts, attempts == 1); l != nil || err != nil {
				return l, err
			}
		}
		g, cause := c.sleep(ctx, s, w, attempts, giveUpBy)
		switch {
		case cause != nil:
			return nil, gaveUp(ctx, c.observer, key, began, tries+attempts, cause)
		case g.fence > 0: // handed over by a release here, already on the line
			l := newLock(c, &c.base, key, keys, w.tok, g.fence, w.ttl, c.validity(epoch.Add(g.at), w.ttl))
			l.reportObtained(ctx, began, max(tries+attempts, 1))
			return l, nil
		}
		c.onLine(key, func(ln *line) { attempt, _ = ln.rejoin(w, time.Now()) })
	}
}

// attemptInLine makes an attempt of a waiter w that began at began, which
// queues it if the key is held. It returns the lock if the waiter got it,
// the error that ends the wait if one does, or neither when the waiter is
// queued. tries counts the attempts so far, this one included; first says
// whether it is the wait's first.
func (c *Client) attemptInLine(ctx context.Context, key string, keys []string, w *waiter, began time.Time, tries int, first bool) (*Lock, error) {
	l, err := c.try(ctx, key, keys, w, true)
	if err != nil {
		if cause := ctxerr.Of(ctx); cause != nil {
			return nil, gaveUp(ctx, c.observer, key, began, tries, cause)
		}
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	if l == nil {
		c.onLine(key, func(ln *line) { ln.queued(w) })
		return nil, nil
	}
	c.onLine(key, func(ln *line) { ln.obtained(w, l.ValidUntil(), first) })
	l.reportObtained(ctx, began, tries)
	return l, nil
}

// awaitSubscription holds the first waiters of a client briefly until its
// subscription is confirmed: a message published before would be lost.
// While the subscription is down, waiters check on their own.
func (c *Client) awaitSubscription(ctx context.Context, s *subscriber) {
	if s.healthy.Load() {
		return
	}
	select {
	case <-s.settled:
	case <-time.After(c.cfg.Recheck):
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
	select {
	case g := <-w.wake:
		return g, nil
	case <-time.After(min(delay, time.Until(giveUpBy))):
		if !time.Now().Before(giveUpBy) {
			return grant{}, errMaxWait
		}
		return grant{}, nil
	case <-ctx.Done():
		return grant{}, ctxerr.Of(ctx)
	case <-c.closing:
		return grant{}, contend.ErrClosed
	}
}

// gaveUp returns the error of a wait for key that began at began, made
// attempts and ended for cause, and reports it to o.
func gaveUp(ctx context.Context, o contend.Observer, key string, began time.Time, attempts int, cause error) error {
	if !errors.Is(cause, contend.ErrClosed) {
		cause = fmt.Errorf("gave up waiting after %v: %w (%w)", time.Since(began).Round(time.Millisecond), contend.ErrConflict, cause)
	}
	return missed(ctx, o, contend.EventGaveUp, key, began, attempts, cause)
}

// grantLease is how long a release reserves the lock for a waiter for ttl
// of another process, until the waiter's attempt turns it into a hold.
func (c *Client) grantLease(ttl time.Duration) time.Duration { return min(c.cfg.GrantLease, ttl) }

// takeAlong returns the waiter deferred here behind tok that its release
// takes along, if any, and whether it is in this client's turn. None until
// the subscription is confirmed: a waiter taken along may be queued, and a
// message published to it before would be lost.
func (c *Client) takeAlong(key, tok string) (along *waiter, inTurn bool) {
	if s := c.sub.Load(); s == nil || !s.healthy.Load() {
		return nil, false
	}
	c.onLine(key, func(l *line) { along, inTurn = l.beginRelease(tok) })
	return along, inTurn
}

// endRelease reports the reply o to tok's release, which took along, to
// key's line, and acts on what the line says; a clean-up waits for ended,
// which closes when the release's call has ended (see scriptbatch.Start).
func (c *Client) endRelease(ctx context.Context, key string, keys []string, tok string, along *waiter, o outcome, ended <-chan struct{}) {
	c.step(ctx, key, keys, ended, func(l *line) (step, bool) { return l.endRelease(tok, along, o) })
}

// step runs event on key's line and does what the step it returns asks:
// wakes waiters, and gives up in Redis, detached, what a departed waiter
// may have there, once after has closed (nil: at once).
func (c *Client) step(ctx context.Context, key string, keys []string, after <-chan struct{}, event func(l *line) (step, bool)) {
	var s step
	c.onLine(key, func(l *line) { s, _ = event(l) })
	handed := false
	for _, u := range s.wakes {
		wake(u.w, u.g)
		handed = handed || u.g.fence > 0
	}
	for _, tok := range s.leave {
		c.cleanUp(ctx, key, keys, tok, after)
	}
	if handed {
		// Give the new holder this processor, as sync.Mutex's Unlock does
		// in its starvation mode: on a hot key the hand-over is what every
		// waiter waits for, and the woken goroutine would otherwise wait
		// until this one blocks, or for another thread to steal it.
		runtime.Gosched()
	}
}

// runRelease lets tok go, the holder's lock of fence, or a waiter's place
// or reservation (fence 0) when it gives up, taking along with it, and
// returns what Redis says of tok's hold (the replies of release.lua).
//
// A hand-over to along in this client's turn is by pass.lua: the common
// hand-over on a key this client's goroutines share, at the cost of a
// take. It changes nothing when tok no longer holds the lock: then the
// release script finds out what became of it, and what along should do.
func (c *Client) runRelease(ctx context.Context, key string, keys []string, tok string, fence int64, along *waiter, inTurn bool) (int64, error) {
	began := time.Now()
	if along != nil && inTurn && fence > 0 {
		cmd, ended := c.calls.Start(ctx, passScript, keys[:2], tok, along.tok, ms(along.ttl))
		next, err := cmd.Int64()
		if err != nil {
			c.endRelease(ctx, key, keys, tok, along, outcome{lost: true}, ended)
			return replyNotHeld, err
		}
		if next > 0 {
			c.endRelease(ctx, key, keys, tok, along, outcome{next: along.tok, fence: next, at: began, inTurn: true}, nil)
			return replyReleased, nil
		}
	}
	// release.lua's arguments: the token, its fence, whether it gives up,
	// where to tell this client's waiters, their places' lease, and the
	// waiter taken along, with its grant lease, TTL and turn (go-redis
	// sends a bool as 1 or 0).
	argv := []any{tok, fence, fence == 0, c.channel, ms(c.waiterLease())}
	if along != nil {
		argv = append(argv, along.tok, ms(c.grantLease(along.ttl)), ms(along.ttl), inTurn)
	}
	cmd, ended := c.calls.Start(ctx, releaseScript, keys, argv...)
	res, err := cmd.Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("distlock: unexpected reply %v from the release script", res)
	}
	held, o := int64(replyNotHeld), outcome{lost: true}
	if err == nil {
		msg, _ := res[1].(string)
		turnPass, _ := res[2].(int64)
		held, _ = res[0].(int64)
		o = released(msg, turnPass == 1, began)
	}
	c.endRelease(ctx, key, keys, tok, along, o, ended)
	return held, err
}

// cleanUp runs tok's leave on a goroutine of the Client's, so that the
// caller whose wait ended returns by its deadline whatever the network
// does; Close waits for it. The leave is sent once after has closed: when
// the call that may have queued tok or taken the lock for it, which its
// caller stopped waiting for, has ended, go-redis's re-sends included, so
// that the leave runs in Redis after it. It is bounded by releaseTimeout
// from then, on ctx's values but not its cancellation.
//
// The leave removes tok from key's queue and releases the lock if tok holds
// it (or it is reserved for tok), handing it to the next waiter: for a
// waiter that gave up, an attempt whose reply was lost, and a lock handed
// to a waiter that had left. Failures are left to the leases (the queue
// entry and the reservation expire by themselves).
func (c *Client) cleanUp(ctx context.Context, key string, keys []string, tok string, after <-chan struct{}) {
	c.cleanups.Add()
	go func() {
		defer c.cleanups.Done()
		if after != nil {
			<-after
		}
		along, inTurn := c.takeAlong(key, tok)
		_, _ = c.runRelease(c.clock.context(ctx), key, keys, tok, 0, along, inTurn)
	}()
}

// waiterLease is how long a waiter's place in a queue lasts without being
// renewed: three rechecks.
func (c *Client) waiterLease() time.Duration { return 3 * c.cfg.Recheck }

package distlock

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// The Client's side of its lines (line.go): it asks a key's line, sends
// what the line says to Redis, and reports the reply back. Hand-overs take
// along the first waiter deferred behind the releaser here, in this
// client's turn by pass.lua without a look at Redis's queue, else by
// release.lua.

// grantLease is how long a release reserves the lock for a waiter for ttl
// of another process, until the waiter's attempt turns it into a hold.
func (c *Client) grantLease(ttl time.Duration) time.Duration { return min(c.cfg.GrantLease, ttl) }

// takeAlong returns the waiter deferred here behind tok that its release
// takes along, if any, and whether it is in this client's turn. None while
// the subscription is unconfirmed: a waiter taken along may be queued, and
// a message published to it then would be lost.
func (c *Client) takeAlong(key, tok string) (along *waiter, inTurn bool) {
	if !c.listening() {
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

// depart reports that w's caller returns without the lock, and gives up
// what w may have in Redis once w's last call has ended.
func (c *Client) depart(ctx context.Context, key string, keys []string, w *waiter) {
	c.step(ctx, key, keys, w.ended, func(l *line) (step, bool) { return l.depart(w) })
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
	if err != nil {
		c.endRelease(ctx, key, keys, tok, along, outcome{lost: true}, ended)
		return replyNotHeld, err
	}
	held, _ := res[0].(int64)
	msg, _ := res[1].(string)
	turnPass, _ := res[2].(int64)
	o := outcome{at: began, inTurn: turnPass == 1}
	if msg != "" {
		var g grant
		o.next, g = parseGrant(msg)
		o.fence, o.lost = g.fence, g.fence == 0
	}
	c.endRelease(ctx, key, keys, tok, along, o, nil)
	return held, nil
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

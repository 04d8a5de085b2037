package distlock

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// The releaser's side of the protocol: a release takes along the first
// waiter deferred behind it here, and hands the lock on, in this client's
// turn without a look at Redis's queue (pass.lua), else by release.lua.
// The line's states and transitions are local.go's.

// grantLease is how long a release reserves the lock for a waiter for ttl
// of another process, until the waiter's attempt turns it into a hold.
func (c *Client) grantLease(ttl time.Duration) time.Duration { return min(c.cfg.GrantLease, ttl) }

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

package distlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
)

// The waiter's side of the protocol: an Obtain that found the key held
// waits in line, here or in Redis, until a release hands it the lock or its
// own attempt finds it free or reserved for it.

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
		if l == nil {
			// Whatever w may have in Redis is given up, even though ctx may
			// have ended: that may be why.
			c.depart(ctx, key, keys, w)
		}
		c.cleanups.Done()
	}()
	s, err := c.register(w)
	if err != nil {
		return nil, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	defer c.unregister(w.tok)
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
		return grant{}, ctxerr.Of(ctx)
	case <-c.closing:
		return grant{}, contend.ErrClosed
	}
}

// gaveUp returns the error of a wait for key that began at began, made
// attempts and ended for cause, and reports it to o.
func gaveUp(ctx context.Context, o contend.Observer, key string, began time.Time, attempts int, cause error) error {
	err := fmt.Errorf("distlock: obtain %q: gave up waiting after %v: %w (%w)",
		key, time.Since(began).Round(time.Millisecond), contend.ErrConflict, cause)
	if errors.Is(cause, contend.ErrClosed) {
		err = fmt.Errorf("distlock: obtain %q: %w", key, cause)
	}
	reportMiss(ctx, o, contend.EventGaveUp, key, began, attempts, err)
	return err
}

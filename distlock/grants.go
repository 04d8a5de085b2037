package distlock

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
)

// A subscriber receives the messages that releases publish on its
// client's channel and wakes the waiters they name. One per Client, started by the
// first wait and stopped by Close: a subscription per waiter would cost a
// connection each, and a shared channel for all processes would wake every
// process at every release.
type subscriber struct {
	ps      *redis.PubSub // set and replaced by listen under the client's mu
	settled chan struct{} // closed by settle once the first subscription succeeded or failed
	settle  func()
	healthy atomic.Bool   // subscribed now: releases' messages will arrive
	done    chan struct{} // closed when the goroutine has ended; it ends with Close
}

// A grant is what wakes a waiter. One with a fence is a hand-over by a
// release of the waiter's own client, which began at at: the waiter holds
// the lock, for its TTL from then, with that fencing token. The zero grant
// asks the waiter to look: a message from another process's release (which
// reserved the lock for it, or says it did), or a release here that took it
// along and left it to check.
type grant struct {
	fence int64
	at    time.Duration // since epoch: a grant has no pointer, and its channel's buffer needs no allocation of its own
}

// register records w for its wake-ups, starting the subscriber if this is
// the client's first wait, and returns the subscriber.
func (c *Client) register(w *waiter) (*subscriber, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, contend.ErrClosed
	}
	s := c.sub.Load()
	if s == nil {
		s = &subscriber{settled: make(chan struct{}), done: make(chan struct{})}
		s.settle = sync.OnceFunc(func() { close(s.settled) })
		c.sub.Store(s)
		go c.listen(s)
	}
	c.waiters[w.tok] = w
	return s, nil
}

// listening reports whether the subscription is confirmed: messages
// published now reach this client.
func (c *Client) listening() bool {
	s := c.sub.Load()
	return s != nil && s.healthy.Load()
}

func (c *Client) unregister(tok string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.waiters, tok)
}

// parseGrant reads the grant in a release's reply: the waiter's token and
// its fencing token. A malformed one only asks the waiter to check.
func parseGrant(msg string) (tok string, g grant) {
	tok, fence, _ := strings.Cut(msg, " ")
	g.fence, _ = strconv.ParseInt(fence, 10, 64)
	if g.fence <= 0 {
		g = grant{}
	}
	return tok, g
}

// wake wakes w with g. A grant for a waiter that has just given up is not
// lost: that waiter's leave finds the lock handed to it and passes it on.
//
// A hand-over's grant replaces a request to look that is still unread
// (a waiter is handed the lock once, so nothing else can be there): the
// waiter would otherwise look, by an attempt of its own, for what the grant
// says.
func wake(w *waiter, g grant) {
	for {
		select {
		case w.wake <- g:
			return
		default:
		}
		if g.fence == 0 {
			return // already woken; the waiter checks anyway
		}
		select {
		case <-w.wake: // a request to look: the grant takes its place
		default:
		}
	}
}

// wakePublished makes the waiter that a published message names look at
// the lock: the message is only a hint, which the waiter's attempt checks.
func (c *Client) wakePublished(tok string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.waiters[tok]; w != nil {
		wake(w, grant{})
	}
}

// wakeAll makes every waiter check the lock now: messages published while the
// subscription was down were lost.
func (c *Client) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waiters {
		wake(w, grant{})
	}
}

// subscribe makes a new subscription for s, unless the client is closing.
// Subscribing dials, so it runs outside the client's lock.
func (c *Client) subscribe(s *subscriber) bool {
	ps := c.rdb.Subscribe(context.Background(), c.channel)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		_ = ps.Close()
		return false
	}
	s.ps = ps
	return true
}

// listen receives the subscription's messages until the client closes: a
// confirmation, after which a resubscription wakes every waiter to check
// (messages published while it was down are lost), or a release's message
// for a waiter. It returns only once Close has begun, which closes the
// subscription it finds; one made later is closed by subscribe. listen is
// the only writer of s.ps, and reads it without the client's mu.
func (c *Client) listen(s *subscriber) {
	defer close(s.done)
	retry := contend.Retry{BaseDelay: 10 * time.Millisecond, MaxDelay: time.Second}
	subscribed, pinged, failures := false, false, 0 // failures: subscriptions failed in a row
	for c.subscribe(s) {
		for {
			msg, err := s.ps.ReceiveTimeout(context.Background(), healthInterval)
			if c.closed.Load() {
				return
			}
			if err != nil {
				// Silence is normal; a ping tells it from a dead connection.
				if pinged = !pinged && isTimeout(err) && s.ps.Ping(context.Background()) == nil; pinged {
					continue
				}
				break
			}
			pinged = false
			switch m := msg.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					failures = 0
					s.healthy.Store(true)
					s.settle()
					if subscribed {
						c.wakeAll()
					}
					subscribed = true
				}
			case *redis.Message:
				c.wakePublished(m.Payload)
			}
		}
		// The connection is gone (Redis restarted, a network failure) or
		// does not answer: a new one after a backoff, while waiters check
		// on their own.
		s.healthy.Store(false)
		s.settle()
		failures++
		t := time.NewTimer(retry.Delay(failures))
		select {
		case <-c.closing:
			t.Stop()
			return
		case <-t.C:
		}
		_ = s.ps.Close()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isNil reports whether v is nil or a typed nil pointer, such as a
// (*redis.Client)(nil) passed as an interface.
func isNil(v any) bool {
	rv := reflect.ValueOf(v)
	return v == nil || rv.Kind() == reflect.Pointer && rv.IsNil()
}

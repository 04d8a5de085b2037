package distlock

import (
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// What a Client knows of its own keys: which of its locks or waiters is at
// the head of its line for a key, which of its waiters wait behind that one
// without having asked Redis, and which keys made its last waiter queue. It
// is sharded by key, so that goroutines locking different keys do not share
// a mutex.
//
// A client has at most one waiter of a key in Redis's queue, or one lock on
// it: its head. Its other waiters for the key defer behind the head, in
// arrival order, and ask Redis nothing. When the lock comes to the client,
// its turn begins: the waiters deferred at that moment get it one after
// another, each handed over by the release before it in one short script,
// without a look at Redis's queue. When they have all had it, the next
// release looks: if another process's waiter is queued, the lock goes to it
// and the client's next waiter is queued behind it, as the new head; if not,
// a new turn begins. A hot key that a process's goroutines take turns on
// therefore costs one round trip per hand-over, the release, and processes
// take turns in the order they queued, each serving the waiters it had when
// its turn began: every waiter gets the key once per round.
//
// The line of one key is in one of three states, by its head:
//
//	state    head  holding  the head
//	empty    ""    -        none: nobody here holds the key or asks Redis for it
//	asking   tok   false    is trying to take the key, or is queued in Redis
//	holding  tok   true     holds the lock, valid until until
//
// A head that is asking, or holding within until, is alive: a waiter that
// comes then defers behind it. Every change is one method, under the
// shard's mutex:
//
//	method        from                to
//	join          empty, or head dead asking: the caller is the head
//	              head alive          unchanged: the caller defers
//	setQueued     empty               asking: the waiter queued in Redis is the head
//	              (any)               busy: the next obtain skips take
//	setHolder     (any)               holding tok; a turn of every waiter deferred now
//	beginRelease  head tok            unchanged; the oldest deferred waiter is sent:
//	                                  tok's release takes it along
//	endRelease    head tok            holding next: the release handed next the lock
//	                                  (one turn fewer, or a new turn if not in turn)
//	                                  asking first: it queued first in Redis
//	                                  empty: every deferred waiter is woken to ask
//	                                  Redis itself
//	rejoin        (a deferred waiter woke without a grant) sent: it leaves, to
//	              ask Redis; head alive: it stays; else asking: it is the head
//	leaveLine     (a deferred waiter gives up) it leaves; reports whether sent
//	clearBusy     (any)               not busy: the key was free again
//
// Invariants: a waiter of this client is in Redis's queue, or holds a
// reservation there, only if it is the head or was sent; a sent waiter is
// woken by the release that took it along (with the lock, or to ask Redis)
// or by its own recheck; and a line with no head, no deferred waiter and no
// busy mark is forgotten.

const localShards = 32

type keyShard struct {
	mu   sync.Mutex
	keys map[string]*keyState
}

type keyState struct {
	busy     bool      // the last wait here had to queue: skip take
	head     string    // the token of this client's lock on key, or of its waiter queued in Redis; "" if none
	holding  bool      // head holds the lock...
	until    time.Time // ...until then, as far as it knew when it obtained it
	deferred []*waiter // waiting behind head, oldest first
	turn     int       // hand-overs to deferred waiters left in this client's turn
}

func (s *keyState) empty() bool { return !s.busy && s.head == "" && len(s.deferred) == 0 }

// dropHead records the end of tok's hold, or of its asking, with the lock
// handed to nobody here: see endRelease.
func (c *Client) dropHead(key, tok string) { c.endRelease(key, tok, nil, "", time.Time{}, false) }

// leaveLine takes w out of the waiters deferred here.
func (s *keyState) undefer(w *waiter) {
	s.drop(func(d *waiter) bool { return d == w })
}

// drop takes the waiter that match picks out of those deferred here. It is
// most often the oldest, whom a hand-over takes: that one leaves at once,
// where any other costs a look at every waiter, which on a hot key is
// every goroutine of the process that wants it.
func (s *keyState) drop(match func(*waiter) bool) {
	if len(s.deferred) > 0 && match(s.deferred[0]) {
		s.deferred[0] = nil
		s.deferred = s.deferred[1:]
		return
	}
	s.deferred = slices.DeleteFunc(s.deferred, match)
}

// forgetIfEmpty drops key's state st when it says nothing any more; sh.mu
// must be held.
func (sh *keyShard) forgetIfEmpty(key string, st *keyState) {
	if st.empty() {
		delete(sh.keys, key)
	}
}

// A waiter is one Obtain waiting for a held key.
type waiter struct {
	tok  string
	ttl  time.Duration
	wake chan grant
	sent bool // may be queued in Redis or granted, by a release (under the shard's mu)
}

func newWaiter(tok string, ttl time.Duration) *waiter {
	return &waiter{tok: tok, ttl: ttl, wake: make(chan grant, 1)}
}

// maxBusy bounds the keys a client remembers as busy; past it, a shard
// forgets those it remembers only for that, and they are learnt again.
const maxBusy = 1024

func (c *Client) shard(key string) *keyShard {
	return &c.local[maphash.String(c.seed, key)%localShards]
}

// join is an Obtain's first look at key. If this client has a head for
// key (a lock still valid, or a waiter that is asking Redis or queued
// there), the waiter is registered and deferred behind it, and returned.
// Else the caller becomes the head, until it holds the key, is queued, or
// leaves; enter reports whether key made this client's last waiter queue.
func (c *Client) join(key, tok string, ttl time.Duration) (w *waiter, busy bool, err error) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key]; st != nil && st.alive() {
		w = newWaiter(tok, ttl)
		if err := c.register(w); err != nil {
			return nil, false, err
		}
		st.deferred = append(st.deferred, w)
		return w, false, nil
	}
	st := c.state(sh, key)
	st.head, st.holding = tok, false
	return nil, st.busy, nil
}

// alive reports whether the head is there to wait behind: a waiter, or a
// lock within the validity it had when obtained.
func (s *keyState) alive() bool {
	return s.head != "" && (!s.holding || time.Now().Before(s.until))
}

// rejoin decides what a deferred waiter w does when it wakes without a grant
// (its recheck, or its head let go without taking it along). Behind a head
// still alive it stays, in its place, or at the end if it had lost it. If a
// release took it along (sent), or nobody is left to wait behind, it must
// ask Redis: in the second case as the head.
func (c *Client) rejoin(key string, w *waiter) (stay, sent bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.sent {
		return false, true
	}
	st := c.state(sh, key)
	if st.alive() && st.head != w.tok {
		if !slices.Contains(st.deferred, w) {
			st.deferred = append(st.deferred, w)
		}
		return true, false
	}
	st.undefer(w)
	st.head, st.holding = w.tok, false
	return false, false
}

// setHolder records that tok holds key here, valid until until.
func (c *Client) setHolder(key, tok string, until time.Time) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := c.state(sh, key)
	st.head, st.holding, st.until = tok, true, until
	st.turn = len(st.deferred)
}

// isHolder reports whether tok holds key here, as setHolder recorded.
func (c *Client) isHolder(key, tok string) bool {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.keys[key]
	return st != nil && st.head == tok && st.holding
}

// setQueued records that tok, a waiter of this client, is in key's queue
// in Redis: the head, unless the client has another.
func (c *Client) setQueued(key, tok string) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := c.state(sh, key)
	st.busy = true
	if st.head == "" {
		st.head, st.holding = tok, false
	}
}

// beginRelease returns the first waiter deferred behind tok, marked sent, if
// tok is key's head here: the release (or departure) of tok about to run
// takes it along, and, if inTurn, may hand it the lock without looking at
// Redis's queue. tok stays the head until endRelease: waiters that come
// meanwhile defer too.
func (c *Client) beginRelease(key, tok string) (w *waiter, inTurn bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.keys[key]
	if st == nil || st.head != tok || len(st.deferred) == 0 {
		return nil, false
	}
	w = st.deferred[0]
	w.sent = true
	return w, st.turn > 0
}

// endRelease records the end of the release (or departure) of tok, key's
// head here, which took along first (or nil). If the lock went to a waiter
// here, next, that one is the head now, holding until until, and first, if
// it is not next, waits behind it again; inTurn says whether the hand-over
// was one of this client's turn, else a new turn starts. If first was
// queued in Redis, it is the head, waiting. Else the client has no head for
// key, and the waiters that deferred while the release was under way are
// told to check by themselves.
func (c *Client) endRelease(key, tok string, first *waiter, next string, until time.Time, inTurn bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	st := sh.keys[key]
	if st == nil || st.head != tok {
		sh.mu.Unlock()
		return
	}
	var orphans []*waiter
	switch {
	case next != "":
		st.head, st.holding, st.until = next, true, until
		st.drop(func(w *waiter) bool { return w.tok == next })
		if first != nil && first.tok != next {
			first.sent = false
		}
		if inTurn {
			st.turn--
		} else {
			st.turn = len(st.deferred)
		}
	case first != nil:
		st.head, st.holding = first.tok, false
		st.undefer(first)
	default:
		st.head, st.holding = "", false
		orphans, st.deferred = st.deferred, nil
		sh.forgetIfEmpty(key, st)
	}
	sh.mu.Unlock()
	for _, w := range orphans {
		wake(w, grant{})
	}
}

// leaveLine takes w out of key's deferred waiters, and reports whether a
// release has taken it to queue it (or hand it the lock).
func (c *Client) leaveLine(key string, w *waiter) (sent bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.keys[key]
	if st != nil {
		st.undefer(w)
		sh.forgetIfEmpty(key, st)
	}
	return w.sent
}

// clearBusy records that a waiter for key did not have to queue: the key is
// free again, and the next obtain tries to take it first.
func (c *Client) clearBusy(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key]; st != nil {
		st.busy = false
		sh.forgetIfEmpty(key, st)
	}
}

// state returns key's state in sh, making it; sh.mu must be held. A shard
// that has grown past its share of maxBusy first forgets the keys it keeps
// only because a waiter once queued on them.
func (c *Client) state(sh *keyShard, key string) *keyState {
	st := sh.keys[key]
	if st == nil {
		if sh.keys == nil {
			sh.keys = map[string]*keyState{}
		}
		if len(sh.keys) >= maxBusy/localShards {
			for k, s := range sh.keys {
				if s.head == "" && len(s.deferred) == 0 {
					delete(sh.keys, k)
				}
			}
		}
		st = &keyState{}
		sh.keys[key] = st
	}
	return st
}

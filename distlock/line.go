package distlock

import (
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// A line is everything a Client knows of one of its keys: which of its
// calls is at the head (holds the lock, or asks Redis for it on behalf of
// everyone here), which wait behind the head without asking Redis, which
// ask Redis by themselves, and the release under way that takes a waiter
// along. Nothing else holds any of it: each waiter's phase is the line's,
// under the same mutex. It does no I/O and reads no clock. Each event is
// one method, which checks that the transition is allowed (it refuses,
// changing nothing, when not) and returns what the caller must do next: wake
// these waiters, give up in Redis what a departed waiter may have there.
// The Client's code that talks to Redis asks the line, acts, and reports
// the reply back.
//
// A client has at most one waiter of a key in Redis's queue, or one lock on
// it, as its head. Its other waiters defer behind the head, in arrival
// order, and ask Redis nothing. When the lock comes to the client, its turn
// begins: the waiters deferred at that moment get it one after another,
// each taken along by the release before it, without a look at Redis's
// queue. When they have all had it, the next release looks: if another
// process's waiter is queued, the lock goes to it and the waiter taken along
// is queued behind it, as the new head. A hot key that a process's
// goroutines take turns on costs one round trip per hand-over, and
// processes take turns in the order they queued.
//
// A waiter's phases, and the events that move it (any other is refused):
//
//	phase     meaning                                  events out
//	joining   made, not in the line yet                join: deferred or asking;
//	                                                   obtained: holding; depart: left
//	deferred  behind the head, has asked Redis nothing beginRelease: sent;
//	                                                   rejoin (head gone): asking;
//	                                                   depart: left, nothing to send
//	asking    its attempts ask Redis; may be queued    obtained: holding; queued: asking;
//	                                                   a release hands it the lock: holding;
//	                                                   depart: left, and leave in Redis
//	sent      taken along by the head's release        another release hands it the lock
//	                                                   (it had queued it): holding;
//	                                                   the release ends: holding, or
//	                                                   asking (queued, its reply lost,
//	                                                   or the lock went to another
//	                                                   waiter here); depart: left, and
//	                                                   the release's end leaves for it
//	holding   holds the lock (the head, until until)   its release: gone from the line;
//	                                                   queued (an older reply): unchanged;
//	                                                   rejoin (grant unread): attempts,
//	                                                   obtained: the same hold;
//	                                                   depart (grant unread): left, leave
//	left      its caller returned without the lock     nothing: never head or holder again
//
// A head that is alive (asking, holding within until, or left with its
// leave under way) is waited behind. A waiter that leaves while a release
// takes it along is settled by that release's end: whatever the release
// gave it (a place in the queue, the lock) is given up by a leave, sent
// after the release's reply, so after the release in Redis too. A lock a
// release hands to a waiter of this client that has left, or that the line
// no longer knows, is given up the same way, by whoever learns of it first.
type line struct {
	head   *waiter   // holds the key here, or asks Redis for it; nil if none
	until  time.Time // head's validity, while it holds
	behind []*waiter // deferred behind head, oldest first
	asked  []*waiter // asking Redis by themselves, head among them while it asks
	along  *waiter   // taken along by the release under way of...
	by     string    // ...this token
	turn   int       // hand-overs to deferred waiters left in this client's turn
	busy   bool      // the last wait here had to queue: the next skips take
}

type phase uint8

const (
	joining phase = iota
	deferred
	asking
	sent
	holding
	left
)

// A waiter is one call that wants the key. Its phase belongs to its line.
type waiter struct {
	tok   string
	ttl   time.Duration
	keys  [4]string  // its key's in Redis (Client.keys); its Lock shares them
	wake  chan grant // buffered; what a release or a message wakes it with
	phase phase
	// ended closes when the waiter's last call to Redis has ended, also
	// one its caller stopped waiting for; set by the waiter's goroutine.
	ended <-chan struct{}
}

// A step is what an event asks the caller to do, outside the line's mutex.
type step struct {
	wakes []wakeup
	leave []string // tokens whose place or lock in Redis must be given up
}

type wakeup struct {
	w *waiter
	g grant
}

// An outcome is what a release's (or leave's) reply said.
type outcome struct {
	next   string    // the waiter of this client that holds the lock now, if any
	fence  int64     // its fencing token
	at     time.Time // when the release was sent: next's lease runs from then
	inTurn bool      // the hand-over was one of this client's turn
	lost   bool      // the reply was lost: the script may or may not have run
}

// alive reports whether the head is there to wait behind.
func (l *line) alive(now time.Time) bool {
	h := l.head
	return h != nil && (h.phase != holding || now.Before(l.until))
}

// join is an Obtain's first look at the key: behind a live head it
// defers, else it becomes the head; busy says its first attempt should
// queue rather than take.
func (l *line) join(w *waiter, now time.Time) (wait, busy, ok bool) {
	if w.phase != joining {
		return false, false, false
	}
	if l.alive(now) {
		w.phase = deferred
		l.behind = append(l.behind, w)
		return true, false, true
	}
	l.ask(w)
	l.head = w
	return false, l.busy, true
}

// ask makes w ask Redis by itself.
func (l *line) ask(w *waiter) {
	w.phase = asking
	l.asked = append(l.asked, w)
}

// obtained records that w's own attempt holds the lock, until until; fresh
// when it was the first attempt of its wait, which finds the key free again.
// An attempt that finds the lock a release here handed w is the same hold.
func (l *line) obtained(w *waiter, until time.Time, fresh bool) bool {
	switch {
	case w.phase == holding && l.head == w:
		if until.After(l.until) {
			l.until = until
		}
		return true
	case w.phase != joining && w.phase != asking:
		return false
	}
	l.asked = remove(l.asked, w)
	w.phase = holding
	l.head, l.until, l.turn = w, until, len(l.behind)
	if fresh {
		l.busy = false
	}
	return true
}

// queued records that w's attempt left it in Redis's queue. A release
// here that handed w the lock after that attempt ran has the last word.
func (l *line) queued(w *waiter) bool {
	if w.phase != asking {
		return w.phase == holding
	}
	l.busy = true
	if l.head == nil {
		l.head = w
	}
	return true
}

// beginRelease returns the oldest waiter deferred behind tok, the head,
// which tok's release (or leave) about to be sent takes along, and whether
// that is in this client's turn; nil when tok is not the head, has a
// release under way already, or nobody waits behind it.
func (l *line) beginRelease(tok string) (along *waiter, inTurn bool) {
	if l.head == nil || l.head.tok != tok || l.along != nil || len(l.behind) == 0 {
		return nil, false
	}
	along = l.behind[0]
	l.behind = remove(l.behind, along)
	along.phase = sent
	l.along, l.by = along, tok
	return along, l.turn > 0
}

// endRelease records the reply o to the release (or leave) of tok, which
// took along (or nil) as beginRelease said. tok is no longer the head; the
// lock's new holder here, if any, is, and is woken with its grant; if
// nobody is, the waiters behind are woken to ask Redis themselves.
func (l *line) endRelease(tok string, along *waiter, o outcome) (s step, ok bool) {
	if along != nil && (along != l.along || l.by != tok) {
		return s, false
	}
	if h := l.head; h != nil && h.tok == tok {
		l.head = nil
		l.asked = remove(l.asked, h)
	}
	if along != nil {
		l.along, l.by = nil, ""
		l.settle(along, o, &s)
	}
	if o.next != "" && (along == nil || o.next != along.tok) {
		l.grantTo(o, &s)
	}
	if l.head == nil {
		for _, w := range l.behind {
			s.wakes = append(s.wakes, wakeup{w: w})
		}
	}
	return s, true
}

// settle decides what became of along, taken along by a release whose
// reply was o.
func (l *line) settle(along *waiter, o outcome, s *step) {
	switch {
	case along.phase == holding:
		// Another release here handed it the lock meanwhile.
	case along.phase == left:
		// Its caller has gone; whatever the release gave it is given up
		// now, after the release. Even when the reply says the lock went
		// to another waiter: a release sent twice may have queued it the
		// first time.
		s.leave = append(s.leave, along.tok)
	case o.lost || o.next != "" && o.next != along.tok:
		// The reply was lost, or the lock went to another waiter here,
		// from Redis's queue: a release sent twice may have queued along
		// the first time, so it asks Redis where it stands.
		l.ask(along)
		s.wakes = append(s.wakes, wakeup{w: along})
	case o.next == along.tok:
		l.hold(along, o, s)
	default: // queued in Redis, behind another process's lock or waiter
		l.ask(along)
		if l.head == nil {
			l.head = along
		}
	}
}

// grantTo handles a release's hand-over to o.next, a waiter of this client
// asking Redis by itself: the lock is its, unless it has left (or is not
// known here any more), when it must be given up.
func (l *line) grantTo(o outcome, s *step) {
	i := slices.IndexFunc(l.asked, func(w *waiter) bool { return w.tok == o.next })
	switch {
	case i >= 0:
		w := l.asked[i]
		l.asked = slices.Delete(l.asked, i, i+1)
		l.hold(w, o, s)
	case l.along != nil && l.along.tok == o.next && l.along.phase == sent:
		// Queued by the release that took it along, whose reply is still
		// on its way, and handed the lock by this one: it holds it, which
		// that reply's end leaves as it is.
		l.hold(l.along, o, s)
	case l.head != nil && l.head.tok == o.next && l.head.phase == holding:
		// Its own attempt found the lock first: the same hold.
	default:
		s.leave = append(s.leave, o.next)
	}
}

// hold makes w, handed the lock by a release whose reply was o, the head.
func (l *line) hold(w *waiter, o outcome, s *step) {
	w.phase = holding
	l.head, l.until = w, o.at.Add(w.ttl-driftMargin(w.ttl, defaultDriftFactor))
	if o.inTurn {
		l.turn--
	} else {
		l.turn = len(l.behind)
	}
	s.wakes = append(s.wakes, wakeup{w: w, g: grant{fence: o.fence, at: o.at.Sub(epoch)}})
}

// depart records that w's caller returns without the lock. A waiter that
// may be queued in Redis, or hold the lock there, must leave (the step
// says so); one taken along by a release under way is left to that
// release's end; a deferred one has nothing in Redis.
func (l *line) depart(w *waiter) (s step, ok bool) {
	switch w.phase {
	case deferred:
		l.behind = remove(l.behind, w)
	case sent:
	case joining, asking, holding:
		// A head stays the head, with its leave under way, until the
		// leave's end: it takes along the waiter behind it.
		l.asked = remove(l.asked, w)
		s.leave = append(s.leave, w.tok)
	default:
		return s, false
	}
	w.phase = left
	return s, true
}

// rejoin decides what w does when it wakes without a grant (a recheck, a
// message, or its head let go without taking it along): attempt reports
// whether it asks Redis now. A deferred waiter behind a live head stays;
// else it asks, as the head if there is none.
func (l *line) rejoin(w *waiter, now time.Time) (attempt, ok bool) {
	switch {
	case w.phase == asking || w.phase == holding:
		// A waiter handed the lock that woke without its grant (a request
		// to look took its place) finds its hold by an attempt.
		return true, true
	case w.phase != deferred && w.phase != sent:
		return false, false
	case w.phase == sent || l.alive(now):
		// The release under way settles it; or it stays behind its head.
		return false, true
	}
	l.behind = remove(l.behind, w)
	l.ask(w)
	l.head = w
	return true, true
}

// idle reports whether nobody here holds or wants the key.
func (l *line) idle() bool {
	return l.head == nil && len(l.behind) == 0 && len(l.asked) == 0 && l.along == nil
}

// empty reports whether the line says nothing any more.
func (l *line) empty() bool { return l.idle() && !l.busy }

func remove(ws []*waiter, w *waiter) []*waiter {
	if len(ws) > 0 && ws[0] == w {
		// Most often the oldest: it leaves without a look at the others,
		// and the last keeps the slice's room for the next.
		ws[0] = nil
		if len(ws) == 1 {
			return ws[:0]
		}
		return ws[1:]
	}
	return slices.DeleteFunc(ws, func(d *waiter) bool { return d == w })
}

// The lines of a Client, sharded by key so that goroutines locking
// different keys do not share a mutex.

const localShards = 32

// maxBusy bounds the keys a client remembers only as busy; past it, a
// shard forgets them, and they are learnt again.
const maxBusy = 1024

type keyShard struct {
	mu    sync.Mutex // protects keys, and every line and waiter in it
	keys  map[string]*line
	spare *line // the last line forgotten, emptied, for the next key
}

func (c *Client) shard(key string) *keyShard {
	return &c.local[maphash.String(c.seed, key)%localShards]
}

// onLine runs event on key's line under its shard's mutex, making the line
// if needed and forgetting it when it says nothing any more.
func (c *Client) onLine(key string, event func(l *line)) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.keys[key]
	if l == nil {
		if sh.keys == nil {
			sh.keys = map[string]*line{}
		}
		if len(sh.keys) >= maxBusy/localShards {
			for k, o := range sh.keys {
				if o.idle() {
					delete(sh.keys, k)
				}
			}
		}
		if l = sh.spare; l == nil {
			l = &line{}
		}
		sh.spare = nil
		sh.keys[key] = l
	}
	event(l)
	if l.empty() {
		// A key locked by one call at a time makes and forgets its line
		// at every call: the next reuses it, and its slices' room.
		delete(sh.keys, key)
		*l = line{behind: l.behind[:0], asked: l.asked[:0]}
		sh.spare = l
	}
}

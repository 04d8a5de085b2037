// Package share lets the callers of one process that want the same
// statement on a key at once share it: at most one is in flight per key,
// sent by one of the callers with an argument of its own, and the callers
// that want it meanwhile sleep, holding nothing (no pooled connection, no
// server session), instead of each sending one. Each learns the answer and
// whether it was the one that sent it: a read's answer is everyone's; a
// claim's win is its sender's, and a loss to every other caller, the key
// being held at a moment within each call.
//
// Sharing never hands a caller an answer older than its call: a caller
// takes only the answer of a statement that started after it arrived. A
// caller that arrives while one is in flight waits for it to end, then
// shares the next, which one of the waiters sends. So an answer is true at
// a moment inside every sharer's call, as if each had sent the statement
// itself; joining whatever is in flight would not give that (it may have
// seen the key before the caller arrived, and before a change the caller
// is entitled to see).
//
// A caller waits for at most the statement in flight when it arrived and
// the one it shares, never past its ctx: when ctx ends, it leaves at once.
// A statement that fails because the ctx of the caller that sent it ended
// is not the others' failure: they try again, and one of them sends the
// next. Any other error is shared, as an answer is.
package share

import (
	"context"
	"sync"
	syncatomic "sync/atomic"
)

// Func runs the statement on key under ctx, with the argument of the
// caller that sends it, and returns its answer.
type Func func(ctx context.Context, key, arg string) (int64, error)

// Calls shares the statements of keys among their callers. It is safe for
// simultaneous use by multiple goroutines.
type Calls struct {
	fn   Func
	sent syncatomic.Int64 // statements sent, ever

	mu sync.Mutex // protects c
	c  core
}

// New returns calls that run fn.
func New(fn Func) *Calls {
	return &Calls{fn: fn, c: core{keys: make(map[string]*entry)}}
}

// Do returns the answer of a statement on key that started after Do was
// called, and whether Do sent it, with arg, or shared one another caller
// sent. When ctx ends first, Do returns at once with ctx's cause.
func (r *Calls) Do(ctx context.Context, key, arg string) (n int64, sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return 0, false, context.Cause(ctx)
	}
	r.mu.Lock()
	rd, lead := r.c.arrive(key)
	r.mu.Unlock()
	for {
		if !lead {
			// A statement was in flight: it may have seen key before this call,
			// so wait for it to end, then send or share the next.
			select {
			case <-rd.turn:
			case <-ctx.Done():
				r.depart(key, rd)
				return 0, false, context.Cause(ctx)
			}
			r.mu.Lock()
			lead = r.c.start(key, rd)
			r.mu.Unlock()
		}
		if lead {
			n, err := r.send(ctx, key, arg, rd)
			return n, true, err
		}
		select {
		case <-rd.done:
		case <-ctx.Done():
			r.depart(key, rd)
			return 0, false, context.Cause(ctx)
		}
		if rd.again == nil {
			return rd.n, false, rd.err
		}
		rd, lead = rd.again, false
	}
}

// send runs rd, the statement on key, under ctx with arg, and hands its
// answer to those who share it.
func (r *Calls) send(ctx context.Context, key, arg string, rd *flight) (n int64, err error) {
	r.sent.Add(1)
	gaveUp := true // until the statement returned: a panic is the sender's too
	defer func() {
		r.mu.Lock()
		r.c.finish(key, rd, n, err, gaveUp)
		r.mu.Unlock()
	}()
	n, err = r.fn(ctx, key, arg)
	gaveUp = err != nil && ctx.Err() != nil
	return n, err
}

func (r *Calls) depart(key string, rd *flight) {
	r.mu.Lock()
	r.c.depart(key, rd)
	r.mu.Unlock()
}

// Sent returns how many statements were sent, ever.
func (r *Calls) Sent() int64 { return r.sent.Load() }

// Callers returns how many callers of key wait for a statement, send one
// or share one.
func (r *Calls) Callers(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.c.keys[key]
	if e == nil {
		return 0
	}
	n := 0
	if e.sent != nil {
		n += e.sent.callers
	}
	if e.next != nil {
		n += e.next.callers
	}
	return n
}

// core is the calls' state and its transitions, pure but for the channels
// it closes: the one owner of which statement is in flight and who shares what.
//
// Invariants, per key: an entry exists only while it has a statement in flight
// (sent) or callers waiting to share the next (next); next is formed only
// behind a statement in flight, or, once that ended, until one of its callers
// sends it; a statement in sent has begun, a statement in next has not, so a caller
// joins only a statement that has not begun.
type core struct {
	keys map[string]*entry
}

// An entry is one key's statements.
type entry struct {
	sent *flight // in flight; nil when none
	next *flight // not begun: its callers wait for sent to end; nil when none
}

// A flight is one statement on a key and those who share it.
type flight struct {
	callers int           // who share it and have not departed
	turn    chan struct{} // closed when the statement before it ended; nil for a statement sent at once
	done    chan struct{} // closed when its answer is in n and err, or again is set
	n       int64
	err     error
	// again is the statement its callers share instead, its sender having
	// given up: the answer is the sender's alone. nil when the answer is
	// theirs.
	again *flight
}

// arrive adds a caller of key: it returns the statement it shares and whether it
// sends it now (no statement on key was in flight), or else must wait for the
// statement's turn.
func (c *core) arrive(key string) (rd *flight, lead bool) {
	e := c.keys[key]
	if e == nil {
		rd = &flight{callers: 1, done: make(chan struct{})}
		c.keys[key] = &entry{sent: rd}
		return rd, true
	}
	if e.next == nil {
		e.next = &flight{turn: make(chan struct{}), done: make(chan struct{})}
		if e.sent == nil {
			panic("share: an entry with no statement at all")
		}
	}
	e.next.callers++
	return e.next, false
}

// start is called by a caller of rd, whose turn came: it reports whether the
// caller sends rd, being the first of its callers to get there; the others
// share it.
func (c *core) start(key string, rd *flight) (lead bool) {
	e := c.keys[key]
	if e == nil || e.next != rd {
		return false // sent by another caller, and maybe ended
	}
	if e.sent != nil {
		panic("share: a statement's turn came while another was in flight")
	}
	e.sent, e.next = rd, nil
	return true
}

// finish records the answer of rd, the statement on key in flight, ending it,
// and the next statement's turn comes. When rd's sender gave up (its ctx ended),
// rd's other callers share the next statement instead, which has not begun.
func (c *core) finish(key string, rd *flight, n int64, err error, gaveUp bool) {
	e := c.keys[key]
	if e == nil || e.sent != rd {
		panic("share: a statement ended that was not in flight")
	}
	rd.n, rd.err = n, err
	e.sent = nil
	if sharers := rd.callers - 1; gaveUp && sharers > 0 {
		if e.next == nil {
			e.next = &flight{turn: make(chan struct{}), done: make(chan struct{})}
		}
		e.next.callers += sharers
		rd.again = e.next
	}
	close(rd.done)
	if e.next == nil {
		delete(c.keys, key)
		return
	}
	close(e.next.turn)
}

// depart takes a caller of rd, whose ctx ended, away (from the statement rd's
// callers were moved to, if they were): a statement not begun that nobody shares
// any more is forgotten, and so is its key if nothing else of it is under
// way.
func (c *core) depart(key string, rd *flight) {
	for rd.again != nil {
		rd = rd.again
	}
	rd.callers--
	e := c.keys[key]
	if e == nil || e.next != rd || rd.callers > 0 {
		return
	}
	e.next = nil
	if e.sent == nil {
		delete(c.keys, key)
	}
}

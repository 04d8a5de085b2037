// Package readshare lets the callers of one process that need the same read
// of a key share it: at most one read of a key is in flight at a time, and
// the callers that want it meanwhile sleep, holding nothing (no pooled
// connection, no server session), instead of each sending one.
//
// Sharing never hands a caller an answer older than its call: a caller
// takes only the answer of a read that started after it arrived. A caller
// that arrives while a read is in flight waits for that read to end, then
// shares the next one, which one of the waiters sends. So an answer is true
// at a moment inside every sharer's call, as if each had sent the read
// itself; joining whatever read is in flight would not give that (the read
// may have seen the key before the caller arrived, and before a change the
// caller is entitled to see).
//
// A caller waits for at most the read in flight when it arrived and the
// read it shares, never past its ctx: when ctx ends, it leaves at once. A
// read that fails because the ctx of the caller that sent it ended is not
// the others' failure: they try again, and one of them sends the next. Any
// other error is shared, as an answer is.
package readshare

import (
	"context"
	"sync"
	syncatomic "sync/atomic"
)

// Func reads key under ctx and returns its answer.
type Func func(ctx context.Context, key string) (int64, error)

// Reads shares the reads of keys among their callers. It is safe for
// simultaneous use by multiple goroutines.
type Reads struct {
	read Func
	sent syncatomic.Int64 // reads sent, ever

	mu sync.Mutex // protects c
	c  core
}

// New returns reads that run read.
func New(read Func) *Reads {
	return &Reads{read: read, c: core{keys: make(map[string]*entry)}}
}

// Do returns the answer of a read of key that started after Do was called,
// sending it itself or sharing one another caller sent. When ctx ends
// first, Do returns at once with ctx's cause.
func (r *Reads) Do(ctx context.Context, key string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, context.Cause(ctx)
	}
	r.mu.Lock()
	rd, lead := r.c.arrive(key)
	r.mu.Unlock()
	for {
		if !lead {
			// A read was in flight: it may have seen key before this call,
			// so wait for it to end, then send or share the next.
			select {
			case <-rd.turn:
			case <-ctx.Done():
				r.depart(key, rd)
				return 0, context.Cause(ctx)
			}
			r.mu.Lock()
			lead = r.c.start(key, rd)
			r.mu.Unlock()
		}
		if lead {
			return r.send(ctx, key, rd)
		}
		select {
		case <-rd.done:
		case <-ctx.Done():
			r.depart(key, rd)
			return 0, context.Cause(ctx)
		}
		if rd.again == nil {
			return rd.n, rd.err
		}
		rd, lead = rd.again, false
	}
}

// send runs the read rd of key under ctx, and hands its answer to those
// who share it.
func (r *Reads) send(ctx context.Context, key string, rd *read) (n int64, err error) {
	r.sent.Add(1)
	gaveUp := true // until the read returned: a panic is the sender's too
	defer func() {
		r.mu.Lock()
		r.c.finish(key, rd, n, err, gaveUp)
		r.mu.Unlock()
	}()
	n, err = r.read(ctx, key)
	gaveUp = err != nil && ctx.Err() != nil
	return n, err
}

func (r *Reads) depart(key string, rd *read) {
	r.mu.Lock()
	r.c.depart(key, rd)
	r.mu.Unlock()
}

// Sent returns how many reads were sent, ever.
func (r *Reads) Sent() int64 { return r.sent.Load() }

// Callers returns how many callers of key wait for a read, send one or
// share one.
func (r *Reads) Callers(key string) int {
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

// core is the reads' state and its transitions, pure but for the channels
// it closes: the one owner of which read is in flight and who shares what.
//
// Invariants, per key: an entry exists only while it has a read in flight
// (sent) or callers waiting to share the next (next); next is formed only
// behind a read in flight, or, once that ended, until one of its callers
// sends it; a read in sent has begun, a read in next has not, so a caller
// joins only a read that has not begun.
type core struct {
	keys map[string]*entry
}

// An entry is one key's reads.
type entry struct {
	sent *read // in flight; nil when none
	next *read // not begun: its callers wait for sent to end; nil when none
}

// A read is one read of a key and those who share it.
type read struct {
	callers int           // who share it and have not departed
	turn    chan struct{} // closed when the read before it ended; nil for a read sent at once
	done    chan struct{} // closed when its answer is in n and err, or again is set
	n       int64
	err     error
	// again is the read its callers share instead, its sender having
	// given up: the answer is the sender's alone. nil when the answer is
	// theirs.
	again *read
}

// arrive adds a caller of key: it returns the read it shares and whether it
// sends it now (no read of key was in flight), or else must wait for the
// read's turn.
func (c *core) arrive(key string) (rd *read, lead bool) {
	e := c.keys[key]
	if e == nil {
		rd = &read{callers: 1, done: make(chan struct{})}
		c.keys[key] = &entry{sent: rd}
		return rd, true
	}
	if e.next == nil {
		e.next = &read{turn: make(chan struct{}), done: make(chan struct{})}
		if e.sent == nil {
			panic("readshare: an entry with no read at all")
		}
	}
	e.next.callers++
	return e.next, false
}

// start is called by a caller of rd, whose turn came: it reports whether the
// caller sends rd, being the first of its callers to get there; the others
// share it.
func (c *core) start(key string, rd *read) (lead bool) {
	e := c.keys[key]
	if e == nil || e.next != rd {
		return false // sent by another caller, and maybe ended
	}
	if e.sent != nil {
		panic("readshare: a read's turn came while another was in flight")
	}
	e.sent, e.next = rd, nil
	return true
}

// finish records the answer of rd, the read of key in flight, ending it,
// and the next read's turn comes. When rd's sender gave up (its ctx ended),
// rd's other callers share the next read instead, which has not begun.
func (c *core) finish(key string, rd *read, n int64, err error, gaveUp bool) {
	e := c.keys[key]
	if e == nil || e.sent != rd {
		panic("readshare: a read ended that was not in flight")
	}
	rd.n, rd.err = n, err
	e.sent = nil
	if sharers := rd.callers - 1; gaveUp && sharers > 0 {
		if e.next == nil {
			e.next = &read{turn: make(chan struct{}), done: make(chan struct{})}
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

// depart takes a caller of rd, whose ctx ended, away (from the read rd's
// callers were moved to, if they were): a read not begun that nobody shares
// any more is forgotten, and so is its key if nothing else of it is under
// way.
func (c *core) depart(key string, rd *read) {
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

// Package keyline keeps a line per key in front of a lock that lives
// elsewhere (a row lock in the database): the calls of one process that
// want the same key wait in the process, in the order they came, and only
// the first few go on to the lock. A call waiting in the line holds nothing
// (no pooled connection, no server session), so a hot key's waiters cannot
// take every connection from the calls on other keys.
//
// The line decides who may try the lock, never who holds it: the lock is
// still what keeps the callers of other processes apart.
package keyline

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Depth is the depth a row lock wants: the holder, and the next call
// already waiting at the server, which takes the lock the moment the holder
// lets go, while the rest wait in the process.
const Depth = 2

// Lines is a line per key, letting at most depth calls of a key through at
// once. It is safe for simultaneous use by multiple goroutines.
type Lines struct {
	mu sync.Mutex // protects c
	c  core
}

// New returns lines letting depth calls of a key through at once (see
// [Depth]). depth must be positive.
func New(depth int) *Lines {
	if depth < 1 {
		panic(fmt.Sprintf("keyline: depth %d is not positive", depth))
	}
	return &Lines{c: core{depth: depth, lines: make(map[string]line)}}
}

// Enter waits until the call may go on to key's lock, and returns nil; it
// is then through, and must call Exit once done with the lock. When ctx
// ends first, Enter leaves the line at once (passing the turn on, if it
// came at that very moment) and returns ctx's cause. A call that need not
// wait costs one map lookup under the mutex, and allocates nothing; one
// that waits reuses a waiter another call left.
func (l *Lines) Enter(ctx context.Context, key string) error {
	_, err := l.Join(ctx, key)
	return err
}

// Join is [Lines.Enter], and also reports whether the call came behind
// another of key's, one let through or waiting: a call that, without the
// lock, would have run beside that one.
func (l *Lines) Join(ctx context.Context, key string) (behind bool, err error) {
	l.mu.Lock()
	w, behind := l.c.join(key)
	l.mu.Unlock()
	if w == nil {
		return behind, nil
	}
	select {
	case <-w.ready:
		waiters.Put(w)
		return true, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	through := l.c.leave(key, w)
	l.mu.Unlock()
	if through {
		<-w.ready // sent under the mutex, before leave could see through
		waiters.Put(w)
		l.Exit(key)
		return true, context.Cause(ctx)
	}
	waiters.Put(w) // out of the line: nothing will be sent to it
	return true, context.Cause(ctx)
}

// Exit ends a call Enter let through, letting the oldest waiter of key
// through in its place.
func (l *Lines) Exit(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c.exit(key)
}

// Waiting returns how many calls wait in key's line.
func (l *Lines) Waiting(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.c.lines[key].waiting)
}

// core is the lines' state and its transitions, pure but for the channels
// it sends to: the one owner of who is through and who waits.
//
// Invariants, per key: 0 < through ≤ depth while the key has an entry (an
// entry with nothing through and nobody waiting is deleted); waiting is
// non-empty only when through == depth (a call is let through whenever
// there is room); a waiter is in waiting, or through (its ready closed),
// never both.
type core struct {
	depth int
	lines map[string]line
}

// A line is one key's calls: held by value, so that a key nobody waits for
// costs the map no allocation.
type line struct {
	through int       // calls let through that have not exited
	waiting []*waiter // oldest first
}

// A waiter is a call waiting in a line. Waiters are reused, channel and
// all, once their call has left the line: a hot key's waiters then cost no
// allocation.
type waiter struct {
	ready   chan struct{} // buffered (1): sent to once, when the waiter is let through
	through bool          // let through; guarded like the core
}

var waiters = sync.Pool{New: func() any { return &waiter{ready: make(chan struct{}, 1)} }}

// join adds a call to key's line: it returns nil when the call is let
// through at once, else the waiter it waits as; and whether another call
// of key was through when it came (or waiting, which implies one is).
func (c *core) join(key string) (w *waiter, behind bool) {
	ln := c.lines[key]
	behind = ln.through > 0
	if ln.through < c.depth {
		ln.through++
		c.lines[key] = ln
		return nil, behind
	}
	w = waiters.Get().(*waiter)
	w.through = false
	ln.waiting = append(ln.waiting, w)
	c.lines[key] = ln
	return w, behind
}

// leave takes w, whose call gave up, out of key's line, and reports
// whether w had been let through already (its turn came as it gave up):
// its call must then exit.
func (c *core) leave(key string, w *waiter) (through bool) {
	if w.through {
		return true
	}
	ln, ok := c.lines[key]
	for i, x := range ln.waiting {
		if x == w {
			// Shifted, not swapped: the others keep their order.
			ln.waiting = slices.Delete(ln.waiting, i, i+1)
			c.lines[key] = ln
			return false
		}
	}
	panic(fmt.Sprintf("keyline: leave of a waiter not in the line of %q (entry %v)", key, ok))
}

// exit ends a call of key that was through, and lets the oldest waiter
// through in its place.
func (c *core) exit(key string) {
	ln, ok := c.lines[key]
	if !ok || ln.through == 0 {
		panic(fmt.Sprintf("keyline: exit of %q, which has no call through", key))
	}
	if len(ln.waiting) > 0 {
		w := ln.waiting[0]
		ln.waiting[0] = nil
		ln.waiting = ln.waiting[1:]
		w.through = true
		w.ready <- struct{}{} // never blocks: the one send to w
		c.lines[key] = ln
		return
	}
	ln.through--
	if ln.through == 0 {
		delete(c.lines, key)
		return
	}
	c.lines[key] = ln
}

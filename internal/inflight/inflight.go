// Package inflight counts the goroutines a type starts for work that
// outlives the call that started it (a release after its caller gave up),
// so that the type's Close can wait for them, bounded by its own ctx.
package inflight

import (
	"context"
	"fmt"
	"sync"

	"github.com/contend/contend/internal/ctxerr"
)

// A Group counts goroutines under way. Unlike a sync.WaitGroup it may be
// added to while it is waited for, and its wait ends with a ctx. The zero
// value is ready; a Group must not be copied after first use.
type Group struct {
	mu   sync.Mutex
	n    int           // goroutines under way; protected by mu
	idle chan struct{} // closed when n drops to 0; nil while it is 0
}

// Add counts one more goroutine under way; its Done counts it out.
func (g *Group) Add() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n++; g.idle == nil {
		g.idle = make(chan struct{})
	}
}

// Done counts out a goroutine that Add counted. A Done without its Add is
// a bug of the caller's, and panics.
func (g *Group) Done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		panic("inflight: Done without Add")
	}
	if g.n--; g.n == 0 {
		close(g.idle)
		g.idle = nil
	}
}

// Go runs fn on a goroutine of its own, counted until fn returns.
func (g *Group) Go(fn func()) {
	g.Add()
	go func() {
		defer g.Done()
		fn()
	}()
}

// Wait returns once no goroutine of g is under way, or, when ctx ends
// first, an error that says how many still are and matches ctx's error.
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-idle: // both came: the goroutines did end
		return nil
	default:
		g.mu.Lock()
		n := g.n
		g.mu.Unlock()
		return fmt.Errorf("%d still under way: %w", n, ctxerr.Of(ctx))
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
)

// Spawner starts and stops the engines that trade for bots: in production,
// containers that take seconds to come up. Spawn is handed the engine's id
// instead of making one, so that the id can be written into the bot's row (the
// claim) before the engine exists, and the engine carries it from birth.
type Spawner interface {
	// Spawn starts engine engineID for bot and returns once it runs.
	Spawn(ctx context.Context, engineID, bot string) error
	// Stop stops engine engineID. It returns an error matching [ErrNoEngine]
	// when no engine with that id runs: it was stopped already, or its spawn
	// has not finished.
	Stop(ctx context.Context, engineID string) error
}

// ErrNoEngine reports that no engine with the given id is running.
var ErrNoEngine = errors.New("botstart: no such engine")

// Engines is an in-process stand-in for a container platform. All instances
// of the service share one, as servers share their Docker host or Kubernetes
// cluster, so any instance can stop an engine another one spawned. It records
// the running engines by id and counts spawns, so that the demo and the tests
// can see whether a bot ever ran twice.
//
// The zero value is ready to use: spawns succeed at once. Set the exported
// fields before first use. Engines is safe for simultaneous use by multiple
// goroutines.
type Engines struct {
	// SpawnDelay is how long a spawn takes, whether it succeeds or fails.
	SpawnDelay time.Duration
	// Hold, when set, is called after SpawnDelay and the spawn waits for it to
	// return; an error fails the spawn. Tests use it to keep a spawn in flight
	// for exactly as long as they need.
	Hold func(ctx context.Context, engineID string) error

	mu       sync.Mutex        // protects the fields below
	running  map[string]string // engine id → bot id
	spawns   int               // begun, failed ones included
	failNext error
}

var _ Spawner = (*Engines)(nil)

// FailNext makes the next spawn to begin fail with err, after its delay.
func (e *Engines) FailNext(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failNext = err
}

// Spawn starts engine engineID for bot. It fails when ctx ends first, with the
// error given to [Engines.FailNext], or when engineID already runs.
func (e *Engines) Spawn(ctx context.Context, engineID, bot string) error {
	e.mu.Lock()
	e.spawns++
	fail := e.failNext
	e.failNext = nil
	e.mu.Unlock()

	if err := sleep(ctx, e.SpawnDelay); err != nil {
		return err
	}
	if e.Hold != nil {
		if err := e.Hold(ctx, engineID); err != nil {
			return err
		}
	}
	if fail != nil {
		return fail
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.running[engineID]; ok {
		return fmt.Errorf("engine %s already runs", engineID)
	}
	if e.running == nil {
		e.running = make(map[string]string)
	}
	e.running[engineID] = bot
	return nil
}

// Stop stops engine engineID, or returns an error matching [ErrNoEngine].
func (e *Engines) Stop(_ context.Context, engineID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.running[engineID]; !ok {
		return fmt.Errorf("stop engine %s: %w", engineID, ErrNoEngine)
	}
	delete(e.running, engineID)
	return nil
}

// Running returns the running engines: engine id → bot id.
func (e *Engines) Running() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.running)
}

// Spawns returns how many spawns have begun, failed ones included.
func (e *Engines) Spawns() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.spawns
}

// sleep waits for d or until ctx ends: a client that gives up mid-spawn must
// not leave its handler waiting for a container nobody wants.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

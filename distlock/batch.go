package distlock

import (
	"context"
	"runtime"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A Client sends the scripts of its goroutines to Redis together when they
// come together: while as many sends are under way as its Redis client has
// connections (see sendLimit), later calls queue,
// and the first call to finish hands the queue, whole, to one of them,
// which sends it as one pipeline. A lone caller sends its script at once,
// on its own; under load each round trip, and each read and write on both
// ends, serves a batch. What each script does, and in which order
// Redis runs the scripts of one goroutine, does not change: a call returns
// only when its script has run.
//
// A queued call waits for its batch even when its ctx ends meanwhile, as a
// command already written to a connection would: its script may run. The
// batch runs on the ctx values of the call that sends it, without its
// cancellation, bounded by the Redis client's own timeouts.

// sendLimit is how many sends (single scripts or batches) of a client may
// be under way at once: as many as rdb has connections. Below that, a call
// held back for a batch would wait for a round trip although a connection
// was free; above it, go-redis makes the call wait for a connection anyway,
// and in a batch that wait also saves a write and a read on both ends.
// Batching sooner loses where waking a goroutine costs more than the
// syscalls it saves: on a 2-core VM, with a limit of 4 and 8 goroutines,
// most batches held one call and obtain+release ran at 0.64x the bare
// commands, against 0.86x with this limit. It is never below 2, so that a
// send stuck on a dead connection does not hold up every other call for
// its timeout.
func sendLimit(rdb RedisClient) int {
	n := 10 * runtime.GOMAXPROCS(0) // go-redis's default pool size
	switch o := rdb.(type) {
	case interface{ Options() *redis.Options }:
		n = o.Options().PoolSize
	case interface{ Options() *redis.ClusterOptions }:
		n = o.Options().PoolSize
	}
	return max(n, 2)
}

type batcher struct {
	limit   int // see sendLimit
	mu      sync.Mutex
	sending int     // sends under way
	queue   []*call // calls waiting for the next batch, oldest first
}

// A call is one script call waiting in a batcher's queue.
type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	batch  []*call       // set before ready is closed: this call sends them, itself first
	ready  chan struct{} // closed when cmd is set, or when the call must send its batch
}

// run runs script, alone or in a batch, and returns its reply.
func (c *Client) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	b := &c.batch
	b.mu.Lock()
	if b.sending < b.limit {
		b.sending++
		b.mu.Unlock()
		cmd := script.Run(ctx, c.rdb, keys, args...)
		c.handOff()
		return cmd
	}
	cl := &call{ctx: ctx, script: script, keys: keys, args: args, ready: make(chan struct{})}
	b.queue = append(b.queue, cl)
	b.mu.Unlock()
	<-cl.ready
	if cl.batch != nil {
		c.send(cl.batch)
		c.handOff()
	}
	return cl.cmd
}

// handOff ends a send: the calls queued meanwhile, if any, are the next
// batch, which the oldest of them sends.
func (c *Client) handOff() {
	b := &c.batch
	b.mu.Lock()
	batch := b.queue
	b.queue = nil
	if len(batch) == 0 {
		b.sending--
	}
	b.mu.Unlock()
	if len(batch) > 0 {
		batch[0].batch = batch
		close(batch[0].ready)
	}
}

// send sends batch as one pipeline; batch[0] is the caller's own call.
func (c *Client) send(batch []*call) {
	lead := batch[0]
	ctx := context.WithoutCancel(lead.ctx)
	if len(batch) == 1 {
		lead.cmd = lead.script.Run(ctx, c.rdb, lead.keys, lead.args...)
		return
	}
	pipe := c.rdb.Pipeline()
	for _, cl := range batch {
		cl.cmd = cl.script.EvalSha(ctx, pipe, cl.keys, cl.args...)
	}
	_, _ = pipe.Exec(ctx) // each reply, or error, is in its cmd
	for _, cl := range batch {
		// Redis lost its scripts (a restart, SCRIPT FLUSH): send the body.
		if redis.HasErrorPrefix(cl.cmd.Err(), "NOSCRIPT") {
			cl.cmd = cl.script.Run(ctx, c.rdb, cl.keys, cl.args...)
		}
	}
	for _, cl := range batch[1:] {
		close(cl.ready)
	}
}

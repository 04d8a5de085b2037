// Package scriptbatch sends the Redis scripts of concurrent callers
// together, and lets each caller stop waiting when its ctx ends, whatever
// the Redis client does.
//
// While as many sends are under way as the Redis client has connections
// (see [Limit]), later calls queue, and the first send to finish takes the
// queue, whole, and sends it as one pipeline. A lone caller's script goes
// out at once, on its own; under load each round trip, and each read and
// write on both ends, serves a batch. What each script does, and the order
// in which Redis runs one goroutine's scripts, do not change.
//
// go-redis ignores ctx deadlines unless its client was built with
// ContextTimeoutEnabled, and re-sends a command after a read timeout, so a
// call on a network that stopped answering returns only when the client's
// read timeouts and retries have run out. On such a client a call whose
// ctx can end runs on a goroutine of the Sender's, and [Sender.Run] returns
// when the reply arrives or ctx ends, whichever comes first. An abandoned
// call may still run on the server: its caller must treat the outcome as
// unknown. [Sender.Close] waits for abandoned calls to end. A client that
// honours ctx deadlines ([HonoursDeadlines]) ends such a call by itself: a
// call whose ctx has a deadline runs on the caller's goroutine, which
// costs less. A ctx that can be cancelled but has no deadline still gets a
// goroutine of the Sender's, since go-redis sees only deadlines, not
// cancellation. Batches (pipelines) always run on the Sender's goroutines,
// for callers with different deadlines, who wait for the reply or their
// ctx, whichever comes first.
package scriptbatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrAbandoned reports a call whose ctx ended before its reply arrived. It
// is joined with ctx's cause.
var ErrAbandoned = errors.New("scriptbatch: gave up waiting for the reply")

// Client is what a Sender needs of go-redis; [redis.UniversalClient]
// satisfies it. Without it, calls are never batched.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Limit is how many sends (single scripts or batches) may be under way at
// once: as many as rdb has connections. Below that, a call held back for a
// batch would wait for a round trip although a connection was free; above
// it, go-redis makes the call wait for a connection anyway, and in a batch
// that wait also saves a write and a read on both ends. It is never below
// 2, so that a send stuck on a dead connection does not hold up every
// other call for its timeout.
func Limit(rdb any) int {
	n := 10 * runtime.GOMAXPROCS(0) // go-redis's default pool size
	switch o := rdb.(type) {
	case interface{ Options() *redis.Options }:
		n = o.Options().PoolSize
	case interface{ Options() *redis.ClusterOptions }:
		n = o.Options().PoolSize
	}
	return max(n, 2)
}

// HonoursDeadlines reports whether rdb ends a call by its ctx's deadline,
// whatever the network does: a go-redis *redis.Client (also one made by
// NewFailoverClient or NewUniversalClient), *redis.Ring or
// *redis.ClusterClient built with ContextTimeoutEnabled, whose read and
// write deadlines are not turned off (ReadTimeout and WriteTimeout other
// than -2). A ClusterClient also needs DisableRoutingPolicies and not
// ReadOnly: otherwise it looks up the server's command table, until that
// first succeeds, on a clock of its own (5s), not ctx's. Any other client,
// a wrapper of one of these too, counts as one that does not.
func HonoursDeadlines(rdb any) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options() // its timeouts normalised: -1 is "no deadline calls"
		return o.ContextTimeoutEnabled && o.ReadTimeout >= 0 && o.WriteTimeout >= 0
	case *redis.Ring:
		o := c.Options() // as given: -2 is "no deadline calls"
		return o.ContextTimeoutEnabled && o.ReadTimeout != -2 && o.WriteTimeout != -2
	case *redis.ClusterClient:
		o := c.Options() // -1 normalised to 0; -2 kept
		return o.ContextTimeoutEnabled && o.ReadTimeout >= 0 && o.WriteTimeout >= 0 &&
			o.DisableRoutingPolicies && !o.ReadOnly
	}
	return false
}

// A Sender sends scripts to one Redis client. It is safe for simultaneous
// use by multiple goroutines. Its goroutines, at most one per send under
// way, wait for the next send when done with one, so that their stacks,
// grown by the Redis client's calls, serve the next; [Sender.Close] ends
// them.
type Sender struct {
	rdb    redis.Scripter
	limit  int
	inline bool         // rdb honours ctx deadlines: send on the caller's goroutine
	work   chan []*call // hands a batch to a waiting goroutine; nil tells it to end

	mu      sync.Mutex    // protects the fields below
	sending int           // sends under way
	pending int           // calls made and not yet answered
	queue   []*call       // calls waiting for the next batch, oldest first
	workers int           // goroutines of the Sender...
	waiting int           // ...of which waiting for a batch that nobody promised them yet
	closed  bool          // Close was called: waiting goroutines end
	gone    chan struct{} // closed when workers drops to 0; nil while it is 0
}

// New returns a Sender that sends to rdb with at most limit sends under
// way at once. An rdb that is not a [Client] has no pipelines: its calls
// are never held back for a batch.
func New(rdb redis.Scripter, limit int) *Sender {
	if _, ok := rdb.(Client); !ok {
		limit = math.MaxInt
	}
	return &Sender{
		rdb: rdb, limit: max(limit, 1), inline: HonoursDeadlines(rdb),
		work: make(chan []*call),
	}
}

// A call is one script call, queued or sent.
type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd    // set before done is closed
	done   chan struct{} // closed when cmd is set
	alone  [1]*call      // the batch of this call alone, without an allocation of its own
}

// Run runs script and returns its reply, or, when ctx ends first, an error
// matching [ErrAbandoned] and ctx's cause: the script may still run. Run
// works after Close too.
func (s *Sender) Run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd, _ := s.Start(ctx, script, keys, args...)
	return cmd
}

// Start is Run, and also returns a channel that is closed when the call
// has ended, or will never be sent: for a call abandoned when ctx ended,
// later than Run returned, once the Redis client is done with it (go-redis
// re-sends a command, or a whole pipeline, after a read timeout). A
// clean-up that must reach Redis after the script, whatever the Redis
// client does, waits for it. A call whose ctx ended while it was queued for
// a batch is not sent.
func (s *Sender) Start(ctx context.Context, script *redis.Script, keys []string, args ...any) (*redis.Cmd, <-chan struct{}) {
	s.mu.Lock()
	s.pending++
	if s.sending >= s.limit {
		cl := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
		s.queue = append(s.queue, cl)
		s.mu.Unlock()
		return cl.wait(), cl.done
	}
	s.sending++
	s.mu.Unlock()
	if deadline, bounded := ctx.Deadline(); ctx.Done() == nil || s.inline && bounded {
		// Nothing can cut the wait short, or the client ends it by ctx's
		// deadline: send it on this goroutine, with no call to allocate.
		var cmd *redis.Cmd
		if ctx.Err() == nil {
			cmd = script.Run(ctx, s.rdb, keys, args...)
			s.failedOver(cmd.Err())
		} else {
			cmd = abandoned(ctx)
		}
		s.mu.Lock()
		s.pending--
		next := s.nextLocked()
		s.mu.Unlock()
		if next != nil {
			s.start(next)
		}
		if err := cmd.Err(); err != nil && bounded && !time.Now().Before(deadline) {
			// The same error as a call abandoned when ctx ended. The
			// socket's deadline may pass before ctx's timer has fired.
			cause := context.Cause(ctx)
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			cmd.SetErr(fmt.Errorf("%w: %w (%w)", ErrAbandoned, cause, err))
		}
		return cmd, ended
	}
	cl := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	cl.alone[0] = cl
	s.start(cl.alone[:])
	return cl.wait(), cl.done
}

// ended is the channel of a call that has ended.
var ended = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Close ends the Sender's goroutines once their sends are done, and waits
// for them: while no call is unanswered, always (they end at once);
// while one is (a call abandoned on a network that does not answer), until
// ctx ends.
func (s *Sender) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	idle, busy, gone := s.waiting, s.pending > 0, s.gone
	s.waiting = 0
	s.mu.Unlock()
	for range idle {
		s.work <- nil
	}
	if gone == nil {
		return nil
	}
	if !busy {
		// The goroutines are waiting for work, or done with their last
		// send and about to: they end at once.
		<-gone
		return nil
	}
	select {
	case <-gone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("scriptbatch: calls still under way: %w", context.Cause(ctx))
	}
}

func (cl *call) wait() *redis.Cmd {
	select {
	case <-cl.done:
		return cl.cmd
	case <-cl.ctx.Done():
		return abandoned(cl.ctx)
	}
}

// abandoned is the reply of a call given up when ctx ended.
func abandoned(ctx context.Context) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("%w: %w", ErrAbandoned, context.Cause(ctx)))
	return cmd
}

// start hands batch to a goroutine of the Sender that waits for one, or to
// a new one.
func (s *Sender) start(batch []*call) {
	s.mu.Lock()
	if s.waiting > 0 {
		s.waiting-- // promised this batch: it now counts as busy
		s.mu.Unlock()
		s.work <- batch
		return
	}
	if s.workers++; s.gone == nil {
		s.gone = make(chan struct{})
	}
	s.mu.Unlock()
	go s.worker(batch)
}

// worker sends batch, then the calls that queued meanwhile, until none did;
// then it waits to be handed the next batch, until Close.
func (s *Sender) worker(batch []*call) {
	defer s.exit()
	for batch != nil {
		s.send(batch)
		var wait bool
		if batch, wait = s.nextOrWait(); wait {
			batch = <-s.work
		}
	}
}

// nextOrWait is nextLocked for a worker, which, when no call queued, waits for
// the next batch (reporting wait), unless the Sender is closed: then it
// ends. Both in one step, so that Close never finds a worker between the
// two, neither busy nor waiting.
func (s *Sender) nextOrWait() (batch []*call, wait bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if batch = s.nextLocked(); batch != nil || s.closed {
		return batch, false
	}
	s.waiting++
	return nil, true
}

// exit counts a worker out, and lets Close return when it was the last.
func (s *Sender) exit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers--; s.workers == 0 {
		close(s.gone)
		s.gone = nil
	}
}

// nextLocked takes the calls queued during a send, the next batch, or,
// when there are none, ends the send and returns nil.
func (s *Sender) nextLocked() []*call {
	batch := s.queue
	s.queue = nil
	if len(batch) == 0 {
		s.sending--
		return nil
	}
	return batch
}

// send sends batch, one script alone or several as one pipeline, and sets
// each call's reply. Calls whose caller gave up while they were queued are
// not sent. A batch runs on the first call's ctx values, without its
// cancellation: the others wait for it too.
func (s *Sender) send(batch []*call) {
	live := batch[:0:0]
	for _, cl := range batch {
		if cl.ctx.Err() != nil {
			cl.cmd = abandoned(cl.ctx)
			continue
		}
		live = append(live, cl)
	}
	switch len(live) {
	case 0:
	case 1:
		cl := live[0]
		cl.cmd = cl.script.Run(cl.ctx, s.rdb, cl.keys, cl.args...)
		s.failedOver(cl.cmd.Err())
	default:
		s.sendPipeline(live)
	}
	s.answered(len(batch))
	for _, cl := range batch {
		close(cl.done)
	}
}

func (s *Sender) sendPipeline(batch []*call) {
	ctx := context.WithoutCancel(batch[0].ctx)
	pipe := s.rdb.(Client).Pipeline()
	for _, cl := range batch {
		cl.cmd = cl.script.EvalSha(ctx, pipe, cl.keys, cl.args...)
	}
	_, _ = pipe.Exec(ctx) // each reply, or error, is in its cmd
	for _, cl := range batch {
		// Redis lost its scripts (a restart, SCRIPT FLUSH): send the body.
		if redis.HasErrorPrefix(cl.cmd.Err(), "NOSCRIPT") {
			cl.cmd = cl.script.Run(ctx, s.rdb, cl.keys, cl.args...)
		}
		s.failedOver(cl.cmd.Err())
	}
}

// failedOver asks a Cluster client to read the cluster's slots again
// after a call failed: a master that died or stopped answering may have
// been replaced by its replica, which go-redis learns only from a MOVED
// reply (which a dead master never sends) or when its map is a minute
// old. The reload runs in the background, at most one at a time.
func (s *Sender) failedOver(err error) {
	if err == nil || err == redis.Nil {
		return
	}
	if c, ok := s.rdb.(interface{ ReloadState(context.Context) }); ok {
		c.ReloadState(context.Background())
	}
}

// answered counts n calls out of pending.
func (s *Sender) answered(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending -= n
}

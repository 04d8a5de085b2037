// Package redisq is the Redis Streams backend of package queue, for many
// instances: one stream per partition, each partition consumed by one
// instance at a time, which holds a distlock lease on it.
//
// The guarantee: jobs of one key are handled one at a time, in the order they
// were added to the stream, by whichever instance holds the key's partition;
// an instance handles a job only while its lease is valid, and stops before
// the next job once it is lost. When an instance dies, its leases expire, and
// the next instance that takes a partition first redelivers the entries the
// dead one had read but not acknowledged, in order, before new ones.
//
// The limits: delivery is at least once. A job whose handler ran but whose
// acknowledgement did not reach Redis (the instance died in between, or lost
// its lease) runs again on the next owner, and a stalled owner may still be
// inside a handler when the next one starts. Handlers must be idempotent, and
// a handler that writes to a database should check the lease's fencing token
// ([Fence]) in the write: see package queue's doc. Instances take free
// partitions up to their share, ⌈partitions / live instances⌉, found through
// heartbeats, and hand partitions back when they hold more (an instance
// joined), one per round.
//
// A job's deliveries are counted by the stream, across owners: [queue.Job]'s
// Attempt is the stream's count (a retry bumps it with XCLAIM, a new owner's
// claim counts too), and [Config.Retry] bounds it, so a job that fails on
// every delivery is dead-lettered after Retry's deliveries, whichever
// instances made them. Each owner that takes a partition delivers a pending
// job at least once, though: entries an owner read and never handled (it
// died, or handed the partition back, mid-batch) carry the count of that
// read, and must not be dead-lettered without running. So a job that kills
// its owner's process is not dead-lettered: each new owner runs it once.
//
// [Queue.Stats] and [Config.Observer] report what one instance did; only a
// partition's depth is read from Redis and is the same for every instance.
//
// # Faults
//
// An owner whose connections to Redis go silent, or whose process stalls,
// past its lease sees its handler's ctx end with [contend.ErrLockLost] when
// the lease's validity passes, on a timer of its own, before Redis lets
// another instance take the partition; it starts no further job and
// acknowledges nothing after it. A handler that does not heed its ctx may
// still be running when the next owner redelivers its job: the fencing token
// ([Fence]) lets the database refuse its late write. A read it sent while
// its lease was valid may still reach Redis after the next owner has started
// (its process stalled, or that one connection was held up), and take
// waiting jobs as if they were its own: the owner sees them pending on its
// next read and delivers them, in order, before the jobs after them, and
// never trims a job still pending. Lost replies and reset connections cost
// nothing but duplicates: go-redis sends a command again when it did not
// hear the reply, and each step is safe to run twice (a re-sent XADD adds
// the job twice, and it runs twice; a re-sent answer is ignored by its
// submitter). One reply is not: the answer that Submit's listener pops from
// its list, if that reply is lost, is gone with it, and its submitter hears
// nothing until its ctx ends, although the job ran; and go-redis waits the
// block time plus 10s for a blocking read's reply before the listener reads
// again.
//
// Jobs live in Redis, as durable as Redis is: a restart without persistence,
// or a failover to a replica that had not received them, loses the jobs not
// yet handled and the answers not yet read, and their submitters hear
// nothing until their ctx ends. The queue recovers by itself: the owners see
// their leases lost, take the partitions again under larger fencing tokens,
// and the streams are made again by the next job.
//
// # Keys
//
// Every key starts with [Config.Prefix]. What each holds, and how long it
// lives:
//
//   - Prefix + "{p}", partition p's stream, with its consumer group: the
//     jobs not yet acknowledged, and the last acknowledged one (each
//     acknowledgement trims the stream below itself). It does not expire: it
//     is the queue, and its group records what was delivered to whom. Delete
//     the streams by hand when a queue is retired.
//   - Inside that group, one consumer per instance that held the partition:
//     deleted when the instance gives the partition up with nothing
//     pending, else by the next owner once it has claimed its entries;
//     and an instance whose Run ends deletes every consumer left with
//     nothing pending, on every partition.
//   - Prefix + "{p}:dead", partition p's dead letters, an entry each with
//     the fields key, payload, id (the job's entry in the partition's
//     stream), attempts and error: kept for people to work through
//     ([Queue.DeadLetters] lists them, [Queue.RequeueDeadLetters] and
//     [Queue.DeleteDeadLetters] take them out), so it does not expire
//     either; [Config.DeadLetterLimit] bounds it, dropping the oldest.
//   - Prefix + "replies:" + an instance's name, the answers to its
//     submitters: it expires [Config.ReplyTTL] after the last answer.
//   - Prefix + "instances", the instances' heartbeats: it expires three
//     balancing rounds (each a quarter of [Config.LeaseTTL], at least
//     200ms) after the last heartbeat, and drops an instance silent that
//     long.
//   - Prefix + "lease:{partition:p}", partition p's lease, and the keys
//     package distlock keeps beside it: the lease expires with
//     [Config.LeaseTTL], its fencing counter a day after its last use.
//
// Partition p's stream and dead letters share the hash tag {p}, and so a
// Cluster slot. Every step the queue takes touches the keys of one slot, so
// the queue runs on one Redis node, Sentinel, or a Cluster.
//
// There is no Do (the [contend.Guard] of package queue): a closure cannot be
// sent to the instance that holds a key's partition, and running it here
// would exclude it neither from that instance's jobs nor from other callers.
// Use package distlock to guard a function across instances.
package redisq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/distlock"
	"github.com/contend/contend/internal/ctxerr"
	"github.com/contend/contend/internal/queuecore"
	"github.com/contend/contend/internal/token"
	"github.com/contend/contend/queue"
)

// ErrRemote wraps the error message a handler on another instance answered a
// submitted job with: the error's type does not survive the trip.
var ErrRemote = errors.New("redisq: handler failed")

// Config configures a [Queue]. Partitions is required, and one of Handler
// and BatchHandler on an instance that runs [Queue.Run]; every other field
// has a default, which its doc states: the zero value of the field takes
// it.
type Config struct {
	// Prefix is put before every key the queue makes. Default: "queue:".
	Prefix string
	// Partitions is the number of streams. Every instance, producers too,
	// must agree on it: it decides which stream a key goes to.
	Partitions int
	// Handler or BatchHandler processes jobs, as in package queue. Only
	// instances that Run need one.
	Handler queue.Handler
	// BatchHandler processes consecutive jobs of a partition together; see
	// Handler.
	BatchHandler queue.BatchHandler
	// MaxBatch is how many entries are read, and given to a BatchHandler,
	// at once. Default: 100.
	MaxBatch int
	// Retry bounds the deliveries of a failing job, counted by the stream
	// across owners (see the package doc), and the wait between them; after
	// the last it goes to the partition's dead letters ([Queue.DeadLetters]). A
	// failed batch is delivered again whole while each of its jobs has more
	// than one delivery left, then its jobs run alone, so only the job that
	// keeps failing is dead-lettered (after Retry's deliveries, or one more
	// when MaxAttempts is 1): a batch of n jobs that keeps failing costs at
	// most MaxAttempts−1+n handler calls and MaxAttempts−1 waits, as
	// [queue.BatchHandler] says. Default: the zero contend.Retry (10
	// deliveries).
	Retry contend.Retry
	// Observer, when set, hears of the jobs this instance handles: failed
	// deliveries (contend.EventFailed, Attempts the stream's delivery
	// count) and dead letters (contend.EventDeadLettered), on the
	// partition's worker goroutine; and of submitters whose ctx ended
	// before the answer came (contend.EventGaveUp), on theirs. A delivery
	// cut short because the lease was lost or Run is ending is no failure:
	// the job is handed over, and reports nothing. These events carry
	// Strategy "queue". The Observer also hears of the partition leases,
	// as events of Strategy "distlock" and Key "partition:" and the
	// partition's number: a lease taken, handed back, lost (the instance
	// stops the partition's jobs), or a refresh or release that failed;
	// not the tries at partitions other instances hold. It must not block.
	// Default: nil, no events.
	Observer contend.Observer
	// LeaseTTL is the lease of a partition: a dead instance's partitions
	// move after at most this long. Default: 5s.
	LeaseTTL time.Duration
	// ReplyTTL is how long answers wait in Redis for an instance that
	// submitted jobs and died. Default: 1m.
	ReplyTTL time.Duration
	// DeadLetterLimit bounds each partition's dead-letter stream: past it,
	// the oldest dead letters are dropped. Redis trims whole nodes of a
	// stream, so a stream may hold up to about a hundred more. Default:
	// 10000.
	DeadLetterLimit int64
}

// The defaults of [Config]'s fields, which their docs state.
const (
	defaultPrefix          = "queue:"
	defaultMaxBatch        = 100
	defaultLeaseTTL        = 5 * time.Second
	defaultReplyTTL        = time.Minute
	defaultDeadLetterLimit = 10000
)

// poll bounds a blocking read, so that a worker notices Close and a lost
// lease within this long even when its stream is idle.
const poll = 200 * time.Millisecond

const group = "workers"

// longestBlock is how long a read may wait in Redis for entries: poll, or
// less when client gives up on a pipeline's replies sooner. The read is
// pipelined, and go-redis waits for a pipeline's replies only its
// ReadTimeout, not the block time plus ten seconds it allows a blocking
// command sent alone.
func longestBlock(client redis.UniversalClient) time.Duration {
	var timeout time.Duration // > 0: the client's ReadTimeout
	switch c := client.(type) {
	case *redis.Client:
		timeout = c.Options().ReadTimeout
	case *redis.ClusterClient:
		timeout = c.Options().ReadTimeout
	case *redis.Ring:
		timeout = c.Options().ReadTimeout
	}
	if timeout <= 0 {
		return poll
	}
	// Redis counts a block in whole milliseconds, and 0 blocks for ever.
	return max(min(poll, timeout/2).Truncate(time.Millisecond), time.Millisecond)
}

func (c Config) validate(needHandler bool) (Config, error) {
	switch {
	case c.Partitions <= 0:
		return c, fmt.Errorf("redisq: partitions %d, want at least 1: %w", c.Partitions, contend.ErrInvalid)
	case c.Handler != nil && c.BatchHandler != nil:
		return c, fmt.Errorf("redisq: both Handler and BatchHandler set: %w", contend.ErrInvalid)
	case needHandler && c.Handler == nil && c.BatchHandler == nil:
		return c, fmt.Errorf("redisq: nil handler: %w", contend.ErrInvalid)
	case c.MaxBatch < 0 || c.LeaseTTL < 0 || c.ReplyTTL < 0 || c.DeadLetterLimit < 0:
		return c, fmt.Errorf("redisq: negative MaxBatch, LeaseTTL, ReplyTTL or DeadLetterLimit: %w", contend.ErrInvalid)
	}
	if c.Prefix == "" {
		c.Prefix = defaultPrefix
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = defaultLeaseTTL
	}
	if c.ReplyTTL == 0 {
		c.ReplyTTL = defaultReplyTTL
	}
	if c.DeadLetterLimit == 0 {
		c.DeadLetterLimit = defaultDeadLetterLimit
	}
	return c, nil
}

// Queue is one instance's view of the streams: a producer (Submit, Enqueue)
// and, while Run runs, a consumer of the partitions it holds.
type Queue struct {
	rdb      redis.UniversalClient
	cfg      Config
	locks    *distlock.Client
	consumer string        // this instance's name in the consumer group
	block    time.Duration // the longest a read waits in Redis for entries

	mu      sync.Mutex // protects the fields below
	running bool
	closed  bool
	stop    context.CancelFunc // ends Run
	ran     chan struct{}      // closed when Run has returned

	ownMu sync.Mutex      // protects owned
	owned []chan struct{} // per partition: nil when not held, else closed to hand it back

	counters []queuecore.Counters // per partition: what this instance did

	waiting    map[string]chan string // submitters by request id; the listener runs once it is set
	stopListen context.CancelFunc     // ends the listener
	listenDone chan struct{}          // closed when the listener has returned
}

// New returns a queue on the streams in rdb, configured by cfg; the queue
// never closes rdb. rdb is a single node's, Sentinel's or Cluster's client
// (see the package doc's Keys). New does not touch Redis and starts no
// goroutine: Run makes a partition's stream and consumer group when it
// takes the partition, and the first Submit starts the answer listener. It
// fails with an error matching [contend.ErrInvalid] when rdb is nil or cfg
// has a bad value.
func New(rdb redis.UniversalClient, cfg Config) (*Queue, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redisq: nil redis client: %w", contend.ErrInvalid)
	}
	cfg, err := cfg.validate(false)
	if err != nil {
		return nil, err
	}
	locks, err := distlock.NewClient(rdb, distlock.Config{
		Prefix: cfg.Prefix + "lease:", TTL: cfg.LeaseTTL, Observer: leaseObserver(cfg.Observer),
	})
	if err != nil {
		return nil, fmt.Errorf("redisq: %w", err)
	}
	return &Queue{rdb: rdb, cfg: cfg, locks: locks, consumer: token.New(), block: longestBlock(rdb),
		ran: make(chan struct{}), listenDone: make(chan struct{}),
		owned: make([]chan struct{}, cfg.Partitions), counters: make([]queuecore.Counters, cfg.Partitions)}, nil
}

var _ queue.Backend = (*Queue)(nil)

// stream is partition p's stream; the hash tag keeps it and its dead letters
// on one Cluster slot.
func (q *Queue) stream(p int) string { return q.cfg.Prefix + "{" + strconv.Itoa(p) + "}" }

// Partition returns key's partition: the same FNV-1a 64 mapping as package
// queue's [queue.Queue.Partition], so the two agree for one Partitions.
func (q *Queue) Partition(key string) int { return queuecore.PartitionOf(key, q.cfg.Partitions) }

// Enqueue adds a job for key to its partition's stream and returns once Redis
// has it. After Close it returns [contend.ErrClosed].
func (q *Queue) Enqueue(ctx context.Context, key string, payload []byte) error {
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return contend.ErrClosed
	}
	_, err := q.add(ctx, key, payload, "")
	return err
}

func (q *Queue) add(ctx context.Context, key string, payload []byte, reply string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("redisq: empty key: %w", contend.ErrInvalid)
	}
	values := []any{"key", key, "payload", payload}
	if reply != "" {
		values = append(values, "reply", q.replies(), "request", reply)
	}
	id, err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.stream(q.Partition(key)), Values: values}).Result()
	if err != nil {
		return "", fmt.Errorf("redisq: add job for %s: %w", key, err)
	}
	return id, nil
}

// Submit adds a job for key and waits for its answer, from whichever
// instance handles it. A handler's error comes back matching [ErrRemote]
// with its message. When ctx ends first the job stays in the stream and may
// still run, and Submit returns an error matching both
// [contend.ErrConflict] and ctx's error.
//
// Answers come back on one list per instance, read by one goroutine that
// Submit starts and Close stops, so that waiting submitters hold no Redis
// connection each.
func (q *Queue) Submit(ctx context.Context, key string, payload []byte) ([]byte, error) {
	var began time.Time
	if q.cfg.Observer != nil {
		began = time.Now()
	}
	id := token.New()
	answer := make(chan string, 1)
	if err := q.await(id, answer); err != nil {
		return nil, err
	}
	defer q.forget(id)
	if _, err := q.add(ctx, key, payload, id); err != nil {
		return nil, err
	}
	select {
	case a := <-answer:
		return decodeAnswer(a)
	case <-ctx.Done():
		err := fmt.Errorf("redisq: job for %s: no answer yet: %w (%w)", key, contend.ErrConflict, ctxerr.Of(ctx))
		queuecore.Report(ctx, q.cfg.Observer, contend.EventGaveUp, key, began, 0, err)
		return nil, err
	case <-q.listenDone:
		return nil, contend.ErrClosed
	}
}

// replies is the list this instance's submitters get their answers on.
func (q *Queue) replies() string { return q.cfg.Prefix + "replies:" + q.consumer }

func (q *Queue) await(id string, answer chan string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return contend.ErrClosed
	}
	if q.waiting == nil {
		q.waiting = map[string]chan string{}
		ctx, cancel := context.WithCancel(context.Background())
		q.stopListen = cancel
		go q.listen(ctx)
	}
	q.waiting[id] = answer
	return nil
}

func (q *Queue) forget(id string) {
	q.mu.Lock()
	delete(q.waiting, id)
	q.mu.Unlock()
}

// listen hands the answers on the reply list to their submitters until ctx
// ends.
func (q *Queue) listen(ctx context.Context) {
	defer close(q.listenDone)
	for ctx.Err() == nil {
		// A second is the shortest block go-redis sends; it bounds how long
		// Close waits for the listener.
		res, err := q.rdb.BLPop(ctx, time.Second, q.replies()).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
				// Redis is failing: do not spin on it.
				select {
				case <-time.After(poll):
				case <-ctx.Done():
				}
			}
			continue
		}
		id, a, _ := strings.Cut(res[1], "|")
		q.mu.Lock()
		answer, ok := q.waiting[id]
		q.mu.Unlock()
		if ok {
			// Only the first answer is taken: delivery is at least once, so
			// a job may be answered again, and the submitter may be gone
			// already; waiting for it would hold up every later answer.
			select {
			case answer <- a:
			default:
			}
		}
	}
}

func encodeAnswer(r queue.Result) string {
	if r.Err != nil {
		return "e" + r.Err.Error()
	}
	return "v" + string(r.Value)
}

func decodeAnswer(s string) ([]byte, error) {
	if strings.HasPrefix(s, "e") {
		return nil, remote(s[1:])
	}
	return []byte(strings.TrimPrefix(s, "v")), nil
}

// remote is the error a handler on another instance failed with, from its
// message.
func remote(msg string) error { return fmt.Errorf("%w: %s", ErrRemote, msg) }

type fenceKey struct{}

// Fence returns the fencing token of the partition lease under which the
// handler that got ctx runs: larger than every earlier owner's. A database
// write that records the largest token seen and refuses smaller ones refuses
// an owner whose lease ran out while it stalled.
func Fence(ctx context.Context) (int64, bool) {
	f, ok := ctx.Value(fenceKey{}).(int64)
	return f, ok
}

// Run takes the partitions no live instance holds and consumes them until
// ctx ends or Close is called; it then stops each partition, releases the
// leases and returns ctx's error, or nil after Close. A handler running at
// that moment sees its ctx cancelled; its job, and the entries read but not
// yet handled, stay pending, and the next owner redelivers them: they are
// handed back, not lost.
func (q *Queue) Run(ctx context.Context) error {
	if _, err := q.cfg.validate(true); err != nil {
		return err
	}
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return contend.ErrClosed
	case q.running:
		q.mu.Unlock()
		return queue.ErrRunning
	}
	q.running = true
	parent := ctx
	ctx, stop := context.WithCancel(ctx)
	q.stop = stop
	q.mu.Unlock()
	defer close(q.ran)
	defer stop()

	var wg sync.WaitGroup
	defer q.leave()
	// Partitions whose owner died become free after their lease; look
	// again well within one lease.
	every := max(q.cfg.LeaseTTL/4, poll)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		q.balance(ctx, &wg, every)
		select {
		case <-ctx.Done():
			wg.Wait()
			return context.Cause(parent) // nil when Close ended the run
		case <-tick.C:
		}
	}
}

// heartbeat records this instance as live, in Redis's clock so that the
// instances' clocks need not agree, forgets instances silent for longer than
// ttl milliseconds, and returns how many are live.
var heartbeat = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
`)

func (q *Queue) instances() string { return q.cfg.Prefix + "instances" }

// balance aims for this instance's share of the partitions, ⌈partitions /
// live instances⌉: it takes free partitions up to its share, and hands one
// back per round while it holds more, so that a joining instance gets work
// and a leaving one's partitions spread over the others.
func (q *Queue) balance(ctx context.Context, wg *sync.WaitGroup, every time.Duration) {
	live, err := heartbeat.Run(ctx, q.rdb, []string{q.instances()}, q.consumer, (3 * every).Milliseconds()).Int()
	if err != nil || live < 1 {
		live = 1 // Redis is failing: keep what we hold, the leases decide
	}
	share := (q.cfg.Partitions + live - 1) / live
	q.ownMu.Lock()
	held := 0
	for _, quit := range q.owned {
		if quit != nil && !isClosed(quit) {
			held++
		}
	}
	if held > share {
		for p := len(q.owned) - 1; p >= 0; p-- {
			if quit := q.owned[p]; quit != nil && !isClosed(quit) {
				close(quit) // the worker stops before its next job and releases the lease
				break
			}
		}
	}
	q.ownMu.Unlock()
	for p := 0; p < q.cfg.Partitions && held < share; p++ {
		q.ownMu.Lock()
		taken := q.owned[p] != nil
		q.ownMu.Unlock()
		if taken {
			continue
		}
		l, err := q.locks.TryObtain(ctx, "partition:"+strconv.Itoa(p), q.cfg.LeaseTTL)
		if err != nil {
			continue // held by another instance, or Redis is down: next round
		}
		held++
		quit := make(chan struct{})
		q.ownMu.Lock()
		q.owned[p] = quit
		q.ownMu.Unlock()
		wg.Go(func() {
			q.consume(ctx, p, l, quit)
			q.ownMu.Lock()
			q.owned[p] = nil
			q.ownMu.Unlock()
		})
	}
}

// leave tells the other instances at once that this one is gone, so they
// take its share without waiting for its heartbeat to lapse, and deletes
// the consumers with nothing pending on every partition's stream, its own
// among them: a worker's own deletion can fail or be outrun by a late
// command, and an instance that leaves last leaves no consumer behind. A
// consumer with entries pending stays for the next owner to reclaim.
func (q *Queue) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	q.rdb.ZRem(ctx, q.instances(), q.consumer)
	streams := make([]string, q.cfg.Partitions)
	for p := range streams {
		streams[p] = q.stream(p)
	}
	_ = q.pruneConsumers(ctx, "", streams...) // the next owner's reclaim prunes too
}

// Owned returns the partitions this instance consumes now.
func (q *Queue) Owned() []int {
	q.ownMu.Lock()
	defer q.ownMu.Unlock()
	var ps []int
	for p, quit := range q.owned {
		if quit != nil && !isClosed(quit) {
			ps = append(ps, p)
		}
	}
	return ps
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Close stops Run and the answer listener, and frees the lease client. It
// returns once they have stopped, or when ctx ends, whichever comes first:
// then it returns an error matching ctx's, and what still runs (a handler
// that does not heed its ctx, a Redis call the client has not given up on
// yet) stops by itself, Run returning after it. Close works before Run and
// is idempotent; a later call waits again. Once Close was called, Submit,
// Enqueue and Run return [contend.ErrClosed], and a Submit still waiting
// returns it too; Stats and the dead-letter methods still work.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	q.closed = true
	running, stop := q.running, q.stop
	listening, stopListen := q.waiting != nil, q.stopListen
	q.mu.Unlock()
	if listening {
		stopListen()
	}
	if running {
		stop()
	}
	if listening {
		select {
		case <-q.listenDone:
		case <-ctx.Done():
			return fmt.Errorf("redisq: close: the answer listener still runs: %w", context.Cause(ctx))
		}
	}
	if running {
		select {
		case <-q.ran:
		case <-ctx.Done():
			return fmt.Errorf("redisq: close: the workers of partitions %v still run: %w", q.Owned(), context.Cause(ctx))
		}
	}
	return q.locks.Close(ctx)
}

// consume handles partition p while l holds it.
func (q *Queue) consume(ctx context.Context, p int, l *distlock.Lock, quit <-chan struct{}) {
	held := l.Hold(ctx) // cancelled the moment the lease is lost
	stream := q.stream(p)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = l.Release(rctx)
		// This instance's consumer goes when it has nothing pending; else
		// the next owner deletes it once it has claimed its entries. On a
		// second of its own: a slow release must not leave it behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = dropConsumer.Run(dctx, q.rdb, []string{stream}, group, q.consumer).Err()
	}()
	hctx := context.WithValue(held, fenceKey{}, l.Fence())
	on := func() bool { return hctx.Err() == nil && !isClosed(quit) }
	if err := q.rdb.XGroupCreateMkStream(hctx, stream, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return
	}
	// First the entries an earlier owner read and never acknowledged, in
	// order: they come before anything new of their keys.
	if !q.reclaim(hctx, p, stream, on) {
		return
	}
	for on() {
		// A read that blocks in Redis past the lease could take entries
		// after the next owner has started, out of its order: it ends
		// while the lease is still valid.
		block := min(q.block, time.Until(l.ValidUntil()))
		if block < time.Millisecond {
			// The lease ends now, unless a refresh moves it: wait for the
			// one or the other without spinning.
			select {
			case <-hctx.Done():
			case <-time.After(time.Millisecond):
			}
			continue
		}
		ds, stale, err := q.read(hctx, stream, block)
		switch {
		case err != nil:
			return
		case stale:
			// The batch just read is among them: reclaim delivers it
			// too, in its place.
			if !q.reclaim(hctx, p, stream, on) {
				return
			}
		case !q.process(hctx, p, ds, on):
			return
		}
	}
}

// read takes up to MaxBatch entries no consumer has had yet, waiting up to
// block for the first, and reports stale when the group holds pending
// entries besides them. Between two batches an owner has nothing pending,
// so those are entries another read took after this owner's last reclaim:
// an earlier owner's, sent while its lease was valid and reaching Redis
// late (a process stalled, a connection held up), or this owner's own,
// whose reply was lost and which go-redis sent again. Nobody else would
// deliver them, they may be older than the batch, and the trim after the
// batch would delete them: the owner must reclaim them, the batch with
// them, in order. The count is asked in the read's round trip, after the
// read on its connection, so that no read between the two goes unseen.
func (q *Queue) read(ctx context.Context, stream string, block time.Duration) (ds []delivery, stale bool, err error) {
	pipe := q.rdb.Pipeline()
	read := pipe.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: q.consumer, Streams: []string{stream, ">"},
		Count: int64(q.cfg.MaxBatch), Block: block,
	})
	pending := pipe.XPending(ctx, stream, group)
	_, _ = pipe.Exec(ctx) // each command's error is read below
	res, err := read.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	summary, err := pending.Result()
	if err != nil {
		return nil, false, err
	}
	var msgs []redis.XMessage
	if len(res) > 0 {
		msgs = res[0].Messages
	}
	if summary.Count != int64(len(msgs)) {
		return nil, true, nil
	}
	ds = make([]delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = delivery{m, toJob(m, 1)} // a new entry's first delivery
	}
	return ds, false, nil
}

// reclaim claims every entry pending in stream's group, whichever consumer
// read it, handles them in order, and then deletes the consumers left with
// nothing pending. It reports false as process does.
func (q *Queue) reclaim(ctx context.Context, p int, stream string, on func() bool) bool {
	for cursor := "0-0"; on(); {
		msgs, next, err := q.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: group, Consumer: q.consumer, Start: cursor, Count: int64(q.cfg.MaxBatch),
		}).Result()
		if err != nil {
			return false
		}
		ds, err := q.claimed(ctx, stream, msgs)
		if err != nil || !q.process(ctx, p, ds, on) {
			return false
		}
		if next == "0-0" {
			return q.pruneConsumers(ctx, q.consumer, stream) == nil
		}
		cursor = next
	}
	return false
}

// dropConsumer deletes consumer ARGV[2] of group ARGV[1] of stream KEYS[1]
// if it has no pending entry: deleting one that has would drop its entries
// from the group, and no owner would deliver them again.
var dropConsumer = redis.NewScript(`
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then
  return 0
end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`)

// pruneConsumers deletes the consumers of the streams' group, other than
// keep, that have no pending entry: those of earlier owners, gone or not
// (an owner that reads again comes back by itself). Each instance's start
// names a new consumer, and nothing else would delete it. It asks every
// stream in one round trip and deletes in a second; a stream that does not
// exist yet has no consumer to delete.
func (q *Queue) pruneConsumers(ctx context.Context, keep string, streams ...string) error {
	asks := q.rdb.Pipeline()
	infos := make([]*redis.XInfoConsumersCmd, len(streams))
	for i, stream := range streams {
		infos[i] = asks.XInfoConsumers(ctx, stream, group)
	}
	_, _ = asks.Exec(ctx) // each command's error is read below
	drops := q.rdb.Pipeline()
	for i, info := range infos {
		consumers, err := info.Result()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "ERR no such key"), err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
			continue
		case err != nil:
			return err
		}
		for _, c := range consumers {
			if c.Pending == 0 && c.Name != keep {
				dropConsumer.Eval(ctx, drops, []string{streams[i]}, group, c.Name)
			}
		}
	}
	if drops.Len() == 0 {
		return nil
	}
	_, err := drops.Exec(ctx)
	return err
}

// A delivery is an entry as this owner delivers it: its job's Attempt is the
// stream's delivery count of the entry.
type delivery struct {
	msg redis.XMessage
	job queue.Job
}

// claimed reads the delivery counts of the entries XAUTOCLAIM just took
// (which counted the claim as a delivery): one XPENDING over their range.
func (q *Queue) claimed(ctx context.Context, stream string, msgs []redis.XMessage) ([]delivery, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	pending, err := q.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: stream, Group: group, Consumer: q.consumer,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs)),
	}).Result()
	if err != nil {
		return nil, err
	}
	count := make(map[string]int, len(pending))
	for _, e := range pending {
		count[e.ID] = int(e.RetryCount)
	}
	ds := make([]delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = delivery{m, toJob(m, max(count[m.ID], 1))}
	}
	return ds, nil
}

// process handles ds in order; it reports false when it stopped early
// because the lease was lost or Run is ending, or Redis failed.
func (q *Queue) process(ctx context.Context, p int, ds []delivery, on func() bool) bool {
	if len(ds) == 0 {
		return true
	}
	if q.cfg.BatchHandler != nil {
		return on() && q.deliver(ctx, p, ds, on)
	}
	for i := range ds {
		if !on() || !q.deliver(ctx, p, ds[i:i+1], on) {
			return false
		}
	}
	return true
}

// deliver runs the handler on ds until it succeeds or the jobs are
// dead-lettered, and acknowledges them; it reports false as process does.
func (q *Queue) deliver(ctx context.Context, p int, ds []delivery, on func() bool) bool {
	pc := &q.counters[p]
	for {
		latest := 0
		for _, d := range ds {
			if d.job.Attempt > 1 {
				pc.Redeliveries.Add(1)
			}
			latest = max(latest, d.job.Attempt)
		}
		results, err := q.handle(ctx, pc, ds)
		if err == nil {
			pc.Handled.Add(int64(len(ds)))
			return q.finish(ctx, p, ds, results, nil)
		}
		if ctx.Err() != nil {
			return false // the lease was lost mid-job, or Run is ending: the next owner redelivers
		}
		for _, d := range ds {
			q.report(ctx, contend.EventFailed, d.job, err)
		}
		switch last := q.cfg.Retry.Attempts(); {
		case len(ds) == 1 && latest >= last:
			pc.DeadLetters.Add(1)
			q.report(ctx, contend.EventDeadLettered, ds[0].job, err)
			return q.finish(ctx, p, ds, nil, err)
		case len(ds) > 1 && latest+1 >= last:
			// Run each alone, so only the job that keeps failing is
			// dead-lettered and the others still get their answers.
			if !q.again(ctx, p, ds, on) {
				return false
			}
			for i := range ds {
				if !on() || !q.deliver(ctx, p, ds[i:i+1], on) {
					return false
				}
			}
			return true
		}
		if !q.again(ctx, p, ds, on) {
			return false
		}
	}
}

// handle runs the handler on the jobs of ds: the plain one on a single job.
func (q *Queue) handle(ctx context.Context, pc *queuecore.Counters, ds []delivery) ([]queue.Result, error) {
	pc.InFlight.Add(int64(len(ds)))
	defer pc.InFlight.Add(-int64(len(ds)))
	if q.cfg.BatchHandler == nil {
		value, err := queuecore.Call(ctx, q.cfg.Handler, ds[0].job)
		return []queue.Result{{Value: value}}, err
	}
	jobs := make([]queue.Job, len(ds))
	for i, d := range ds {
		jobs[i] = d.job
	}
	return queuecore.CallBatch(ctx, q.cfg.BatchHandler, jobs)
}

// again waits before the next delivery of ds and counts it in the stream
// (XCLAIM without JUSTID adds one to each entry's delivery count), so that an
// owner taking the partition over continues the count rather than restarting
// it. It reports false when the worker must stop instead.
func (q *Queue) again(ctx context.Context, p int, ds []delivery, on func() bool) bool {
	latest := 0
	ids := make([]string, len(ds))
	for i, d := range ds {
		latest = max(latest, d.job.Attempt)
		ids[i] = d.msg.ID
	}
	if q.cfg.Retry.Wait(ctx, latest) != nil || !on() {
		return false
	}
	err := q.rdb.XClaim(ctx, &redis.XClaimArgs{
		Stream: q.stream(p), Group: group, Consumer: q.consumer, Messages: ids,
	}).Err()
	if err != nil {
		return false
	}
	for i := range ds {
		ds[i].job.Attempt++
	}
	return true
}

// leaseObserver forwards to o what operators need to hear of the partition
// leases: each balancing round tries the partitions other instances hold,
// and those conflicts are routine.
func leaseObserver(o contend.Observer) contend.Observer {
	if o == nil {
		return nil
	}
	return contend.ObserverFunc(func(ctx context.Context, e contend.Event) {
		if e.Kind != contend.EventConflict {
			o.Observe(ctx, e)
		}
	})
}

// report reports an event of job's delivery under ctx, the partition
// lease's, whose fencing token the event carries.
func (q *Queue) report(ctx context.Context, kind contend.EventKind, job queue.Job, err error) {
	if q.cfg.Observer == nil {
		return
	}
	fence, _ := Fence(ctx)
	q.cfg.Observer.Observe(ctx, contend.Event{
		Kind: kind, Strategy: queuecore.Strategy, Key: job.Key, Attempts: job.Attempt, Fence: fence, Err: err,
	})
}

// finish dead-letters (on err), answers and acknowledges ds, in that order
// and in steps of their own: a reply list is on a slot of its own. In this order a submitter told
// its job was dead-lettered finds it in the dead-letter stream, and a crash
// or a failure between two steps makes the next owner run the jobs again,
// which dead-letters or answers them twice (the submitter takes the first
// answer); it never loses a job, nor acknowledges one whose answer was not
// written.
func (q *Queue) finish(ctx context.Context, p int, ds []delivery, results []queue.Result, err error) bool {
	args := make([]any, 1, 1+len(ds)) // ack's: the group, then the ids
	args[0] = group
	dead := q.rdb.Pipeline()
	replies := q.rdb.Pipeline()
	for i, d := range ds {
		args = append(args, d.msg.ID)
		r := queue.Result{Err: err}
		if err == nil {
			r = results[i]
		} else {
			dead.XAdd(ctx, &redis.XAddArgs{Stream: q.deadLetters(p), MaxLen: q.cfg.DeadLetterLimit, Approx: true, Values: []any{
				"key", d.job.Key, "payload", d.job.Payload, "id", d.msg.ID,
				"attempts", d.job.Attempt, "error", err.Error(),
			}})
		}
		if reply, ok := d.msg.Values["reply"].(string); ok {
			req, _ := d.msg.Values["request"].(string)
			replies.LPush(ctx, reply, req+"|"+encodeAnswer(r))
			replies.PExpire(ctx, reply, q.cfg.ReplyTTL)
		}
	}
	for _, step := range []redis.Pipeliner{dead, replies} {
		if step.Len() == 0 {
			continue
		}
		if _, err := step.Exec(ctx); err != nil {
			return false
		}
	}
	return ack.Run(ctx, q.rdb, []string{q.stream(p)}, args...).Err() == nil
}

// ack acknowledges entries ARGV[2], ARGV[3], ... of group ARGV[1] of stream
// KEYS[1], and trims the stream below the last of them, never by length:
// one owner handles the partition in order, so every entry below it is
// done; unless an entry older than it is still pending, which is not done
// (a read that reached Redis late took it, and the owner reclaims it), and
// the trim stops below that one. Running it twice changes nothing more.
var ack = redis.NewScript(`
local n = #ARGV
for i = 2, n, 1000 do -- unpack has a limit
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, math.min(i + 999, n)))
end
local bound = ARGV[n]
local oldest = redis.call('XPENDING', KEYS[1], ARGV[1])[2]
if oldest then
  local oms, oseq = string.match(oldest, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(bound, '^(%d+)-(%d+)$')
  oms, oseq, bms, bseq = tonumber(oms), tonumber(oseq), tonumber(bms), tonumber(bseq)
  if oms < bms or (oms == bms and oseq < bseq) then
    bound = oldest
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', bound)
`)

func toJob(m redis.XMessage, attempt int) queue.Job {
	key, _ := m.Values["key"].(string)
	payload, _ := m.Values["payload"].(string)
	return queue.Job{Key: key, Payload: []byte(payload), Attempt: attempt}
}

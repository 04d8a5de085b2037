package distlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
	"github.com/contend/contend/internal/scriptbatch"
	"github.com/contend/contend/internal/token"
)

// ErrNoQuorum reports that fewer than a majority of a [Quorum]'s nodes
// answered: the nodes are down or unreachable, which is not a lost race. It
// is joined with the nodes' errors.
var ErrNoQuorum = errors.New("distlock: no quorum")

// QuorumConfig configures a [Quorum]. The zero value is ready to use: every
// field has a documented default.
type QuorumConfig struct {
	// Prefix is put before every key. Zero means "distlock:".
	Prefix string
	// TTL is the lease of a lock that [Quorum.Do] takes; Do refreshes it
	// every third of its validity. Zero means 10s; at least [MinTTL].
	TTL time.Duration
	// NoWait makes [Quorum.Do] give up at once when the key is held.
	// False (the default): Do waits.
	NoWait bool
	// MaxWait bounds every wait when ctx allows longer. Zero means 30s.
	MaxWait time.Duration
	// NodeTimeout bounds each node's answer: a node that answers later
	// counts as failed, so a slow node cannot eat the lease. Zero means
	// 50ms.
	NodeTimeout time.Duration
	// DriftFactor is the share of the TTL allowed for the nodes' clocks
	// running at different rates; 2ms are added to it. The validity of a
	// lock is TTL minus the time its attempt took minus that allowance.
	// Zero means 0.01; below 0.5.
	DriftFactor float64
	// Backoff paces the attempts of a wait. Quorum waits poll, with jitter
	// so that competing waiters do not retry in step; there is no queue
	// across independent nodes. Its MaxAttempts is ignored. Zero means
	// contend.Retry's defaults; MaxDelay at most 100ms.
	Backoff contend.Retry
	// Observer, when set, hears what the quorum's locks do, as
	// Config.Observer does; the events carry no fencing token. Nil (the
	// default): no events.
	Observer contend.Observer
}

// A Quorum takes locks over several independent Redis masters (Redlock): a
// lock is held when a majority of the nodes granted it within its validity,
// so it survives the loss of a minority of them. With N nodes, up to
// (N-1)/2 may be down. One node is no quorum: a single Redis, however
// reliable, that restarts without persistence or fails over to a replica
// that had not yet received the lock, forgets it, and the next caller gets
// it too. Use a [Client] on one node when a rare double grant is
// acceptable, a Quorum when it must survive a node's loss.
//
// A Quorum offers no fencing tokens ([Lock.Fence] is 0). A fencing token
// must come from one counter that every grant increments in order; each
// node of a quorum has its own, and two majorities overlap in only one node,
// so no node's counter is guaranteed to have seen the previous grant: a
// token built from them can go backwards after a node restarts. Where
// fencing matters, use a [Client] on one durable deployment, or a
// consensus system.
//
// After a failed attempt the Quorum deletes its token from every node, also
// from nodes that did not answer in time, so that a partial grant does not
// block the key until it expires. Waits poll with jittered backoff.
//
// Every call returns within NodeTimeout of each node, whatever the network
// does; [Quorum.Close] waits for the node calls that did not answer in time.
// A Quorum never closes the node clients. It is safe for simultaneous use
// by multiple goroutines.
type Quorum struct {
	base
	nodes  []*scriptbatch.Sender
	cfg    QuorumConfig
	quorum int
}

var _ contend.Guard = (*Quorum)(nil)

// NewQuorum returns a Quorum over nodes, which must be independent masters
// (not replicas of each other, not one Cluster). It fails with an error
// matching [contend.ErrInvalid] when nodes is empty or has a nil node, or
// cfg has a bad value.
func NewQuorum(nodes []redis.Scripter, cfg QuorumConfig) (*Quorum, error) {
	if len(nodes) == 0 {
		return nil, fmt.Errorf("distlock: quorum without nodes: %w", contend.ErrInvalid)
	}
	for i, n := range nodes {
		if isNil(n) {
			return nil, fmt.Errorf("distlock: quorum node %d is nil: %w", i, contend.ErrInvalid)
		}
	}
	if cfg.DriftFactor < 0 || cfg.DriftFactor >= 0.5 {
		return nil, fmt.Errorf("distlock: QuorumConfig.DriftFactor %v is not in [0, 0.5): %w", cfg.DriftFactor, contend.ErrInvalid)
	}
	err := common("QuorumConfig", &cfg.Prefix, &cfg.TTL, &cfg.MaxWait, map[string]time.Duration{"NodeTimeout": cfg.NodeTimeout})
	if err != nil {
		return nil, err
	}
	cfg.NodeTimeout, cfg.DriftFactor = cmp.Or(cfg.NodeTimeout, defaultNodeTimeout), cmp.Or(cfg.DriftFactor, defaultDriftFactor)
	if cfg.Backoff.MaxDelay <= 0 || cfg.Backoff.MaxDelay > 100*time.Millisecond {
		cfg.Backoff.MaxDelay = 100 * time.Millisecond
	}
	senders := make([]*scriptbatch.Sender, len(nodes))
	for i, n := range nodes {
		// As many calls at once as the node's pool has connections, and
		// never fewer than two: one stuck call must not fail the node for
		// every other until it times out.
		senders[i] = scriptbatch.New(n, scriptbatch.Limit(n))
	}
	return &Quorum{base: base{drift: cfg.DriftFactor, observer: cfg.Observer}, nodes: senders, cfg: cfg, quorum: len(nodes)/2 + 1}, nil
}

// TryObtain makes one attempt to lock key for ttl on a majority of the
// nodes. It returns an error matching [contend.ErrConflict] when the key is
// held (enough nodes answered "taken" that no majority is possible), one
// matching [ErrNoQuorum] when too few nodes answered.
func (q *Quorum) TryObtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return q.obtain(ctx, key, ttl, false)
}

// Obtain is [Quorum.TryObtain], repeated with jittered backoff while the key
// is held, until ctx ends or MaxWait passes; it then returns an error
// matching both [contend.ErrConflict] and ctx's error. [ErrNoQuorum] ends
// the wait at once.
func (q *Quorum) Obtain(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	return q.obtain(ctx, key, ttl, true)
}

// Do is [Client.Do] over the quorum: obtain (waiting unless NoWait),
// refresh while fn runs, cancel fn's ctx with [contend.ErrLockLost] when a
// majority can no longer be proven, release on every node.
func (q *Quorum) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	return do(ctx, key, fn, func() (*Lock, error) { return q.obtain(ctx, key, q.cfg.TTL, !q.cfg.NoWait) })
}

// Close waits, until ctx ends, for the node calls that did not answer
// within NodeTimeout to end. The Quorum can still release its locks after.
func (q *Quorum) Close(ctx context.Context) error {
	var errs []error
	for _, n := range q.nodes {
		errs = append(errs, n.Close(ctx))
	}
	if err := errors.Join(append(errs, q.holds.Wait(ctx))...); err != nil {
		return fmt.Errorf("distlock: close quorum: %w", err)
	}
	return nil
}

func (q *Quorum) obtain(ctx context.Context, key string, ttl time.Duration, wait bool) (*Lock, error) {
	ttl, err := checkObtain(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if wait {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, q.cfg.MaxWait, errMaxWait)
		defer cancel()
	}
	for attempt := 1; ; attempt++ {
		l, err := q.attempt(ctx, key, ttl)
		if err == nil {
			l.reportObtained(ctx, began, attempt)
			return l, nil
		}
		// ctx ended during the attempt, cutting the nodes' calls short:
		// the wait ended, as it does in the backoff below, whatever the
		// nodes that did answer said.
		ended := wait && ctxerr.Of(ctx) != nil
		if !ended && (!wait || !errors.Is(err, contend.ErrConflict)) {
			err = fmt.Errorf("distlock: obtain %q: %w", key, err)
			if errors.Is(err, contend.ErrConflict) {
				reportMiss(ctx, q.observer, contend.EventConflict, key, began, attempt, err)
			}
			return nil, err
		}
		if ended || q.cfg.Backoff.Wait(ctx, attempt) != nil {
			return nil, gaveUp(ctx, q.observer, key, began, attempt, ctxerr.Of(ctx))
		}
	}
}

// attempt is one round of Redlock: SET NX PX on every node at once, held if
// a majority said yes before the validity (ttl less the time taken and the
// drift allowance) ran out; otherwise the token is deleted everywhere.
func (q *Quorum) attempt(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	keys := []string{q.cfg.Prefix + "{" + key + "}"}
	tok := token.New()
	began := time.Now()
	held, err := q.vote(ctx, "lock", quorumLockScript, keys, leaseArgs(tok, ttl), isOne)
	l := newLock(q, &q.base, key, keys, tok, 0, ttl, began.Add(ttl-q.margin(ttl)))
	if held && time.Now().Before(l.ValidUntil()) {
		return l, nil
	}
	// Also the nodes that failed: their SET may have run, its reply lost.
	_, _ = q.release(q.clock.context(ctx), l)
	switch {
	case err != nil:
		return nil, err
	case !held:
		return nil, contend.ErrConflict
	}
	return nil, fmt.Errorf("the majority took longer than the lease's validity: %w", ErrNoQuorum)
}

// vote runs script on every node at once, each bounded by NodeTimeout, and
// reports whether a majority said yes (a reply that yes accepts: held), or
// enough said no that no majority can say yes (not held); else, too few
// nodes answered, an error matching ErrNoQuorum, joined with the nodes'
// errors, says what (what) reached how many. yes, given the node's index
// and reply, runs on the nodes' goroutines at once. A node's call that its
// client does not end by the timeout (go-redis ignores ctx deadlines by
// default) is left to finish on the node's Sender, which Close waits for.
func (q *Quorum) vote(ctx context.Context, what string, script *redis.Script, keys []string, args []any, yes func(node int, reply int64) bool) (bool, error) {
	errs := make([]error, len(q.nodes))
	var ayes, noes atomic.Int32
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, q.cfg.NodeTimeout)
			defer cancel()
			reply, err := n.Run(nctx, script, keys, args...).Int64()
			switch {
			case err == nil && nctx.Err() != nil:
				// An answer after the timeout counts as none: waiting for
				// slow nodes would spend the lease.
				errs[i] = fmt.Errorf("node %d answered after %v: %w", i, q.cfg.NodeTimeout, nctx.Err())
			case err != nil:
				errs[i] = fmt.Errorf("node %d: %w", i, err)
			case yes(i, reply):
				ayes.Add(1)
			default:
				noes.Add(1)
			}
		})
	}
	wg.Wait()
	switch {
	case int(ayes.Load()) >= q.quorum:
		return true, nil
	case int(noes.Load()) > len(q.nodes)-q.quorum:
		return false, nil
	}
	return false, fmt.Errorf("%s reached %d of %d nodes: %w", what, ayes.Load()+noes.Load(), len(q.nodes),
		errors.Join(append([]error{ErrNoQuorum}, errs...)...))
}

func (q *Quorum) refresh(ctx context.Context, l *Lock, ttl time.Duration) (bool, error) {
	began := time.Now()
	held, err := q.vote(ctx, "refresh", quorumRefreshScript, l.keys, leaseArgs(l.token, ttl), isOne)
	if held && time.Since(began) >= ttl-q.margin(ttl) {
		return false, fmt.Errorf("the majority took longer than the lease's validity: %w", ErrNoQuorum)
	}
	return held, err // not held: a majority no longer has the token, lost for good
}

func (q *Quorum) release(ctx context.Context, l *Lock) (bool, error) {
	// A node's lock that is gone before l's validity passed was deleted by
	// this release: sent again after a lost reply, it finds its own work.
	// Nobody else deletes l's token, and it cannot have expired yet.
	inTime := time.Now().Before(l.ValidUntil())
	return q.vote(ctx, "release", quorumUnlockScript, l.keys, []any{l.token}, func(_ int, v int64) bool { return v == 1 || v == 2 && inTime })
}

func (q *Quorum) pttl(ctx context.Context, l *Lock) (time.Duration, bool, error) {
	left := make([]time.Duration, len(q.nodes)) // 0 for a node that does not hold it
	held, err := q.vote(ctx, "ttl", quorumPTTLScript, l.keys, []any{l.token}, func(node int, v int64) bool {
		left[node] = time.Duration(max(v, 0)) * time.Millisecond
		return v != -3
	})
	if !held {
		return 0, false, err
	}
	// A majority holds it for as long as its quorum-th longest lease.
	slices.Sort(left)
	return left[len(left)-q.quorum], true, nil
}

// isOne is the yes of the lock and refresh scripts.
func isOne(_ int, reply int64) bool { return reply == 1 }

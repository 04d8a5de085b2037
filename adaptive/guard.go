package adaptive

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keyline"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
	"github.com/contend/contend/optimistic"
)

// strategy is the Strategy of the locked path's events.
const strategy = contend.StrategyAdaptive

// A Guard runs fn for a key inside a transaction, optimistically while the
// key's races are rare and after locking its row while they are frequent (see
// the package doc for how it decides), so that the writes fn makes through
// the transaction ([contend.Querier], or pgxdb.Querier under pgx) are never
// lost, across goroutines and processes, whichever mode each call ran in.
//
// A Guard does not keep fn exclusive: in optimistic mode fns for one key
// overlap, and only one per version commits. fn may run more than once per Do:
// everything it does outside the transaction happens once per attempt and is
// not rolled back. The table needs the key and version columns; every writer
// of the state a key stands for must go through this package or package
// optimistic, so that each of its writes moves the version.
//
// A Guard is safe for simultaneous use by multiple goroutines. It holds no
// connection between calls and never closes the db it was given.
type Guard struct {
	db       sqldb.DB
	opt      *optimistic.Guard
	opts     txn.Options // of the locked path's transactions
	observer contend.Observer
	stats    *table
	line     *keyline.Lines // of the locked path; nil under NoLocalQueue

	lockSQL    string // key; locks key's row by moving its version
	table, key string // quoted, for tests that change lockSQL

	// Set by tests only, before the first call.
	pinned bool // every call runs in pin, and records nothing
	pin    Mode
}

var (
	_ contend.Guard    = (*Guard)(nil)
	_ contend.Promiser = (*Guard)(nil)
)

// NewGuard validates cfg and returns a Guard on db: a pool (a [*sql.DB],
// sqlx's DB, or a pgx pool wrapped by pgxdb.Wrap), on which Do begins a
// transaction per attempt, or a transaction the caller owns, in which Do
// runs fn once and leaves retrying to the owner. A Do whose ctx carries
// another SQL guard's transaction joins it, unless it was begun on another
// database ([contend.ErrInvalid]). It fails with an error matching
// [contend.ErrInvalid] when db is nil or of another kind, a single
// connection ([*sql.Conn], a wrapped *pgx.Conn: one server session, on
// which two calls would share one transaction; pass the pool it came from),
// when a name is not a plain identifier, or when a threshold is out of
// range.
func NewGuard(db contend.DB, cfg Config) (*Guard, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d, err := sqldb.Open(db)
	if err != nil {
		return nil, fmt.Errorf("adaptive: %w", err)
	}
	n, err := cfg.names(d.Dialect())
	if err != nil {
		return nil, err
	}
	var line *keyline.Lines
	if !cfg.NoLocalQueue {
		line = keyline.New(keyline.Depth)
	}
	g := &Guard{
		line:     line,
		db:       d,
		opts:     txn.Options{Tx: d.Dialect().GuardTx(sql.LevelDefault), Retry: cfg.Retry, FinishTimeout: cfg.FinishTimeout},
		observer: cfg.Observer,
		stats:    newTable(cfg),
		// The lock is taken by the bump, not by SELECT ... FOR UPDATE and a
		// bump after fn: one statement instead of two inside the lock, which
		// is what a hot key's throughput is made of. Bumping first is as
		// safe as bumping last: what matters is that the version moves in
		// the transaction fn writes in (see the package doc).
		table:   n.table,
		key:     n.key,
		lockSQL: fmt.Sprintf("UPDATE %s SET %s = %s + 1 WHERE %s = %s", n.table, n.version, n.version, n.key, d.Dialect().Param(1)),
	}
	g.opt, err = optimistic.NewGuard(db, optimistic.Config{
		Table:         cfg.Table,
		KeyColumn:     cfg.KeyColumn,
		VersionColumn: cfg.VersionColumn,
		Retry:         cfg.Retry,
		FinishTimeout: cfg.FinishTimeout,
		Observer:      losses{g},
	})
	if err != nil {
		return nil, fmt.Errorf("adaptive: %w", err)
	}
	return g, nil
}

// losses hears the optimistic path's events, and passes them on to the
// Guard's Observer. An attempt that lost its race (its version moved, or a
// deadlock) is a sample of its key as it is lost, before the wait that
// Config.Retry puts before the next attempt and before that attempt gets a
// connection: on a key that just turned hot, those waits grow with each
// loss (to half a second by default), and a loss counted only when the
// next attempt ran would keep the key optimistic that much longer. Across
// processes, it is what a process whose calls lose to the others' locked
// holders learns from.
type losses struct{ g *Guard }

func (l losses) Observe(ctx context.Context, e contend.Event) {
	if e.Kind == contend.EventRetry && !l.g.pinned {
		l.g.stats.record(e.Key, 1, 1)
	}
	if l.g.observer != nil {
		l.g.observer.Observe(ctx, e)
	}
}

// Promises says what Do promises: fn runs in the guard's transaction, across
// processes, and waits (or retries) for a contested key; in optimistic mode
// fns overlap and the losers run again, so fn is neither exclusive nor run at
// most once.
func (g *Guard) Promises() contend.Promises {
	return contend.Promises{Waits: true, AcrossProcesses: true, InTransaction: true}
}

// Mode returns the mode key's next call in this process will run in.
func (g *Guard) Mode(key string) Mode {
	if g.pinned {
		return g.pin
	}
	return g.stats.mode(key)
}

// Do runs fn in a transaction that fn reaches through [contend.Querier], in
// the mode key is in (see [Guard.Mode]), and commits it. In optimistic mode
// it commits only if key's version did not move since the attempt read it,
// bumping it, and runs fn again otherwise, under [Config.Retry]; in locked
// mode it first locks key's row by bumping its version, waiting for the lock
// as long as ctx allows.
//
// Do returns fn's error unchanged (after rolling back); an error matching
// [contend.ErrNotFound] when key has no row; an error matching
// [contend.ErrConflict], naming key, when every attempt lost its race or ctx
// ended while Do waited for the lock (then it matches ctx's error too); ctx's
// error when ctx ends first; or the database's error. A panic in fn rolls back
// and propagates.
func (g *Guard) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if key == "" {
		return fmt.Errorf("adaptive: do: empty key: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("adaptive: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	if g.Mode(key) == Pessimistic {
		return g.doLocked(ctx, key, fn)
	}
	return g.doOptimistic(ctx, key, fn)
}

// errToLock ends an optimistic attempt whose key went under the lock since
// the call began: the call goes on in locked mode.
var errToLock = errors.New("adaptive: key went under the lock; going on there")

func (g *Guard) doOptimistic(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	// Each run of fn after the first follows an attempt that lost its race
	// (its version moved, or a deadlock), which losses recorded as it was
	// lost, not when the call ends: on a key that just turned hot, the
	// losers are the calls still retrying, and they are the ones that must
	// learn at once that the key went under the lock.
	runs := 0
	var fnErr error // of the last run of fn
	err := g.opt.Do(ctx, key, func(ctx context.Context) error {
		runs++
		// A call that lost a race on a key that has since gone under the
		// lock would go on losing to the lock's holders, each of which
		// moves the version: it joins them instead. So does a call whose
		// key went under the lock while it waited for a connection, before
		// fn's first run: on a key that just turned hot, those are the
		// calls that came meanwhile, and each would hold its connection
		// through a run of fn that the lock's holders make it lose.
		if !g.pinned && g.stats.mode(key) == Pessimistic {
			return errToLock
		}
		fnErr = fn(ctx)
		return fnErr
	})
	if g.pinned {
		return err
	}
	if errors.Is(err, errToLock) {
		return g.doLocked(ctx, key, fn)
	}
	// The last run lost its race only when the guard gave up on the key;
	// fn's own error, a refusal such as "sold out" that matches ErrConflict
	// too, is an answer about the state, not a lost race.
	g.stats.record(key, 1, b2i(fnErr == nil && errors.Is(err, contend.ErrConflict)))
	return err
}

// waitFactor is how much longer than its hold a lock must have taken to count
// as waited for, when the call did not come behind another of this process
// in the key's queue (a caller in another process, or no queue). An
// uncontended lock costs one round trip, no longer than the hold that
// follows it (fn, then at least the COMMIT's round trip); a lock behind
// several other holders costs several holds. The margin keeps the noise of
// a round trip from counting as a wait, and leaves a wait behind a single
// holder of another process uncounted.
const waitFactor = 2

func (g *Guard) doLocked(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	began := time.Now()
	behind := false // came behind another call of this process in key's queue
	if g.line != nil {
		h, err := txn.Resolve(ctx, g.db)
		if err != nil {
			return fmt.Errorf("adaptive: do %q: %w", key, err)
		}
		// Only a transaction of the guard's own waits in the line: a
		// joined one may already hold the key, and must not wait behind
		// itself.
		if h.Owned() {
			if behind, err = g.line.Join(ctx, key); err != nil {
				err = classify(ctx, key, err)
				if !g.pinned {
					g.stats.record(key, 1, 1) // waited until ctx ended
				}
				if g.observer != nil {
					g.report(ctx, key, 0, began, time.Time{}, 0, err)
				}
				return err
			}
			// Held across the retries: a deadlock's rerun keeps its turn.
			defer g.line.Exit(key)
		}
	}
	var (
		locked   time.Time // when the last attempt got the lock; zero if none did
		lockTook time.Duration
		attempts int
	)
	_, err := txn.RunTx(ctx, g.db, g.opts, func(ctx context.Context, tx sqldb.Tx) error {
		attempts++
		locked = time.Time{}
		start := time.Now()
		if attempts == 1 {
			start = began // a wait in the line is a wait for the lock
		}
		n, err := g.lock(ctx, tx, key)
		if err == nil && n == 0 {
			err = sql.ErrNoRows
		}
		if err != nil {
			return classify(ctx, key, err)
		}
		locked = time.Now()
		lockTook = locked.Sub(start)
		if g.observer != nil {
			g.observer.Observe(ctx, contend.Event{Kind: contend.EventObtained, Strategy: strategy, Key: key,
				Wait: locked.Sub(began), Attempts: attempts})
		}
		return fn(ctx)
	})
	if err != nil && sqlerr.Retryable(err) && !errors.Is(err, contend.ErrConflict) && context.Cause(ctx) == nil {
		// A deadlock or serialization failure in fn's own statements, not
		// retried because the transaction is someone else's, or after the
		// attempts ran out: only a run from the start can succeed.
		err = fmt.Errorf("adaptive: do %q: transaction must be run again: %w (%w)", key, contend.ErrConflict, err)
	}
	var hold time.Duration
	if !locked.IsZero() {
		hold = time.Since(locked)
	}
	if !g.pinned {
		switch {
		case !locked.IsZero():
			// A call behind another of this process would have run beside
			// it without the lock, and one of the two would have lost its
			// race: the same sample as an optimistic attempt's, so that a
			// key with two or three callers at once measures alike in both
			// modes, and does not flap between them.
			g.stats.record(key, 1, b2i(behind || lockTook > waitFactor*hold))
		case errors.Is(err, contend.ErrConflict):
			g.stats.record(key, 1, 1) // waited until ctx ended
		}
	}
	if g.observer != nil {
		g.report(ctx, key, attempts, began, locked, hold, err)
	}
	return err
}

// lockArgs holds the lock statement's one argument: an array of a pool
// rather than a slice literal, which would escape to the heap through the
// driver's interface on every call.
var lockArgs = sync.Pool{New: func() any { return new([1]any) }}

// lock runs the lock statement for key in tx, and returns the rows it
// moved.
func (g *Guard) lock(ctx context.Context, tx sqldb.Tx, key string) (int64, error) {
	args := lockArgs.Get().(*[1]any)
	args[0] = key
	n, err := txn.WatchExec(ctx, tx, g.lockSQL, args[:])
	if errors.Is(err, txn.ErrNoAnswer) {
		// The statement was left to finish on a goroutine of its own, which
		// still reads args.
		return n, err
	}
	args[0] = nil
	lockArgs.Put(args)
	return n, err
}

func (g *Guard) report(ctx context.Context, key string, attempts int, began, locked time.Time, hold time.Duration, err error) {
	e := contend.Event{Strategy: strategy, Key: key, Attempts: attempts, Err: err}
	switch {
	case !locked.IsZero():
		e.Kind, e.Wait, e.Hold = contend.EventReleased, locked.Sub(began), hold
	case errors.Is(err, contend.ErrConflict):
		e.Kind, e.Wait = contend.EventGaveUp, time.Since(began)
	default:
		e.Kind = contend.EventFailed
	}
	g.observer.Observe(ctx, e)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// classify turns a failed lock into the error the caller branches on. A lock
// still awaited when ctx ended is a lost race, as package pessimistic reports
// it, and the caller's own error, so that either test matches.
func classify(ctx context.Context, key string, err error) error {
	if sqldb.NoRows(err) {
		return fmt.Errorf("adaptive: lock %q: %w", key, contend.ErrNotFound)
	}
	if cerr := context.Cause(ctx); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("adaptive: lock %q: waited until ctx ended: %w (%w)", key, contend.ErrConflict, err)
		}
		return fmt.Errorf("adaptive: lock %q: waited until ctx ended: %w (%w: %w)", key, contend.ErrConflict, cerr, err)
	}
	if sqlerr.Is(err, sqlerr.LockNotAvailable) {
		return fmt.Errorf("adaptive: lock %q: not available within the server's lock_timeout: %w (%w)", key, contend.ErrConflict, err)
	}
	// Deadlocks stay unwrapped here, for txn.RunTx to recognise and retry.
	return fmt.Errorf("adaptive: lock %q: %w", key, err)
}

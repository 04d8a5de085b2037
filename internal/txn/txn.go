// Package txn runs a function inside a transaction, the one way the SQL
// strategies do: decide whose transaction it is, begin, commit on success,
// roll back on error or panic, and run the whole transaction again when the
// server says that may succeed.
package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
)

// DefaultFinishTimeout is the default of [Options.FinishTimeout].
const DefaultFinishTimeout = 5 * time.Second

// Options says how [Run] runs its transaction.
type Options struct {
	// Tx is passed to BeginTx, and never changed; nil means the driver's
	// defaults.
	Tx *sql.TxOptions
	// Retry bounds the attempts when a transaction fails with a retryable
	// error.
	Retry contend.Retry
	// Retryable says which errors of fn or of the commit are worth running
	// the whole transaction again for, besides deadlocks and serialization
	// failures (always retried where Run owns the transaction). Optional.
	Retryable func(error) bool
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction Run owns (see [Run]). Default: [DefaultFinishTimeout].
	FinishTimeout time.Duration
}

// Handle is where a guard's statements run, decided from the handle it was
// given and the context of the call.
type Handle struct {
	// Tx is a transaction someone else owns, to run in; nil when the guard
	// begins transactions of its own on Pool.
	Tx sqldb.Tx
	// Pool begins the guard's own transactions; nil when Tx is set.
	Pool sqldb.DB
}

// Owned reports whether the guard owns its transactions.
func (h Handle) Owned() bool { return h.Tx == nil }

// Resolve decides where a call on d runs. A transaction runs the call in
// itself. A pool runs it in the transaction ctx carries ([contend.Querier]
// or pgxdb.Querier: fn of another SQL guard, or of an outer call), so nested
// guards share one transaction and the server sees, and breaks, any
// deadlock between their locks; with none, the guard begins its own on the
// pool.
func Resolve(ctx context.Context, d sqldb.DB) (Handle, error) {
	if tx := d.Tx(); tx != nil {
		return Handle{Tx: tx}, nil
	}
	outer, err := d.Outer(ctx)
	if err != nil {
		return Handle{}, err
	}
	if outer != nil {
		return Handle{Tx: outer}, nil
	}
	return Handle{Pool: d}, nil
}

// Run is [RunTx] for a handle not yet opened and a fn that takes
// database/sql's transaction (nil under pgx: fn then reaches it through
// ctx, with pgxdb.Querier).
func Run(ctx context.Context, db contend.DB, opts Options, fn func(ctx context.Context, tx contend.DBTX) error) (attempts int, err error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return 0, err
	}
	if fn == nil {
		return 0, fmt.Errorf("nil fn: %w", contend.ErrInvalid)
	}
	return RunTx(ctx, d, opts, func(ctx context.Context, tx sqldb.Tx) error { return fn(ctx, tx.DBTX()) })
}

// RunTx runs fn inside a transaction and returns the number of attempts
// and the last error. fn's ctx carries the transaction for
// [contend.Querier] and pgxdb.Querier. Where the transaction comes from is
// [Resolve]'s decision.
//
// In a transaction of its own, RunTx commits when fn returns nil and rolls
// back otherwise, also on panic (re-raised). A deadlock or serialization
// failure (SQLSTATE 40P01, 40001), or an error opts.Retryable accepts, rolls
// back and runs the whole transaction again under opts.Retry: an aborted
// PostgreSQL transaction cannot go on, so nothing short of a fresh one can
// succeed.
//
// The COMMIT or ROLLBACK is waited for as long as the server takes to answer,
// so RunTx never returns while the server still holds the transaction's locks,
// but at most opts.FinishTimeout: a network that went silent (a partition, a
// frozen peer) would otherwise hold RunTx until the kernel gives up on the
// connection. When the bound passes, RunTx returns an error matching
// [context.DeadlineExceeded] (after a COMMIT: it may or may not have been
// applied), and the connection is abandoned: closed at once by a driver that
// watches the transaction's context (pgx), or left to the driver until its
// call returns (lib/pq). The server rolls back a transaction whose COMMIT it
// never got, and lets go of its locks, once it notices the session is gone
// (its tcp_keepalives_* and idle_in_transaction_session_timeout settings).
//
// BEGIN is watched like a statement (see [Watch]): a call into a silent
// network returns [CancelGrace] after ctx's end, so a call returns within
// ctx's deadline, plus CancelGrace, plus opts.FinishTimeout, as long as fn's
// own statements return when ctx ends. When fn fails with [ErrNoAnswer] (a
// watched statement given up on, which database/sql's Rollback would wait
// for), RunTx does not wait for the rollback: it returns at once, within
// ctx's deadline plus CancelGrace, and the rollback runs detached, bounded
// by opts.FinishTimeout, on a connection the driver has marked broken, so
// that the pool closes it rather than hand it out again.
//
// In a transaction someone else owns, fn runs once, RunTx neither commits
// nor rolls back, and errors are returned for the owner to handle: only it
// can run its transaction again from the start.
func RunTx(ctx context.Context, d sqldb.DB, opts Options, fn func(ctx context.Context, tx sqldb.Tx) error) (attempts int, err error) {
	h, err := Resolve(ctx, d)
	if err != nil {
		return 0, err
	}
	if fn == nil {
		return 0, fmt.Errorf("nil fn: %w", contend.ErrInvalid)
	}
	if !h.Owned() {
		if err := context.Cause(ctx); err != nil {
			return 0, err
		}
		err := withDeath(h.Tx, fn(h.Tx.Context(ctx), h.Tx))
		if h.Tx.Err() != nil {
			// The owner, a caller's code or a guard's, must see it dead too,
			// whatever it makes of this call's error.
			_ = Within("rollback", DefaultFinishTimeout, func() error { sqldb.EndDead(h.Tx); return nil }, func() {})
		}
		return 1, err
	}
	retryable := func(err error) bool {
		return sqlerr.Retryable(err) || (opts.Retryable != nil && opts.Retryable(err))
	}
	return opts.Retry.Do(ctx, func(ctx context.Context) error {
		return once(ctx, h.Pool, opts, fn)
	}, retryable)
}

// once runs one attempt: begin, fn, commit or roll back.
//
// database/sql rolls back a transaction whose ctx ends on a goroutine of its
// own and lets the caller go on at once: a guard could return, and its
// caller try the key again, before the server had let go of the
// transaction's locks. So the transaction is begun on a context of its own,
// which ctx's end does not cancel once the transaction has begun, and rolled
// back here, before once returns. The wait for a connection, BEGIN and fn's
// statements still end with ctx, and a transaction whose ctx ended while fn
// ran is rolled back, not committed.
func once(ctx context.Context, d sqldb.DB, opts Options, fn func(context.Context, sqldb.Tx) error) (err error) {
	if sqldb.TxEndsWithCtx(d) {
		return onceEnding(ctx, d, opts, fn)
	}
	// txCtx is cancelled when ctx ends during BEGIN, and when a COMMIT or
	// ROLLBACK outlives its bound. The handles that come here (lib/pq's and
	// go-sql-driver/mysql's, through database/sql) commit and roll back
	// under no ctx at all, so the bound is kept by Within's timer, and the
	// call is left to finish alone.
	//
	// A ctx that cannot end needs no txCtx: BEGIN cannot be cut short by
	// it, and cancelling the context of a COMMIT or ROLLBACK given up on
	// changes nothing for database/sql, whose transaction is done once
	// Commit or Rollback was called. The transaction then costs no context,
	// and the drivers no goroutine watching one.
	txCtx, abandonTx := ctx, func() {}
	stopWatching := func() bool { return true }
	if ctx.Done() != nil {
		txCtx, abandonTx = context.WithCancel(context.WithoutCancel(ctx))
		stopWatching = context.AfterFunc(ctx, abandonTx)
	}
	e := ender{ctx: txCtx, abandon: abandonTx, bound: opts.FinishTimeout}
	tx, err := e.begin(ctx, d, txCtx, opts.Tx)
	inTime := stopWatching() // false: ctx ended during BEGIN
	if errors.Is(err, ErrNoAnswer) {
		return err // begin rolls back once BEGIN returns
	}
	if err != nil {
		e.abandon()
		if !inTime {
			return errors.Join(context.Cause(ctx), err)
		}
		return err
	}
	ended := false
	defer func() {
		if ended {
			return
		}
		if errors.Is(err, ErrNoAnswer) {
			// A statement of fn's was given up on and still runs: database/sql's
			// Rollback waits for it, which on a silent network lasts until the
			// kernel gives up on the connection. The call returns now, and the
			// rollback runs detached, within the same bound. The connection is
			// not pooled again in an unknown state: the driver marked it broken
			// when the statement's ctx ended (lib/pq, pgx's stdlib and
			// go-sql-driver/mysql all do), and database/sql closes a broken
			// connection rather than pool it once the rollback returns.
			go func() { _ = e.end("rollback", tx.Rollback) }()
			err = fmt.Errorf("%w (the transaction is rolled back in the background, and the server holds its locks "+
				"until it sees the rollback or the connection closed)", err)
			return
		}
		// Runs on error and on panic alike.
		if rerr := e.end("rollback", tx.Rollback); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			err = errors.Join(err, rerr)
		}
	}()
	if !inTime {
		// ctx ended during BEGIN: database/sql is rolling the transaction
		// back already, and the deferred rollback waits for that.
		return context.Cause(ctx)
	}
	if err := withDeath(tx, fn(tx.Context(ctx), tx)); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	ended = true
	return e.end("commit", tx.Commit)
}

// onceEnding is once for a handle whose transactions end with their ctx
// (pgx, natively or through database/sql; see [sqldb.TxEndsWithCtx]). Its
// BEGIN, COMMIT and ROLLBACK run under one context of the transaction's
// own, txCtx, which ctx's end cancels during BEGIN only, and a timer
// cancels when the COMMIT or ROLLBACK outlives its bound: the driver then
// closes the connection at once. So no goroutine waits for an answer, and
// the promises are once's, kept by the timer and the driver.
//
// A transaction that ctx's end caught during BEGIN holds nothing yet: its
// rollback runs under the cancelled txCtx, so the driver closes the
// connection rather than wait for a ROLLBACK.
func onceEnding(ctx context.Context, d sqldb.DB, opts Options, fn func(context.Context, sqldb.Tx) error) (err error) {
	txCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	inTime := true // false: ctx ended during BEGIN
	var tx sqldb.OwnTx
	if ctx.Done() == nil {
		tx, err = d.Begin(txCtx, opts.Tx)
	} else {
		stopWatching := context.AfterFunc(ctx, abandon)
		tx, err = d.Begin(txCtx, opts.Tx)
		inTime = stopWatching()
	}
	if err != nil {
		if !inTime {
			return errors.Join(context.Cause(ctx), err)
		}
		return err
	}
	if !inTime {
		_ = tx.Rollback(txCtx)
		return context.Cause(ctx)
	}
	ended := false
	defer func() {
		if ended {
			return
		}
		// Runs on error and on panic alike.
		if rerr := endBy(txCtx, abandon, opts.FinishTimeout, "rollback", tx.Rollback); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			err = errors.Join(err, rerr)
		}
	}()
	if err := withDeath(tx, fn(tx.Context(ctx), tx)); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	ended = true
	return endBy(txCtx, abandon, opts.FinishTimeout, "commit", tx.Commit)
}

// withDeath returns err, fn's error, told the truth about tx: when the
// server rolled tx back, whatever fn made of the statement that found it
// (a nested guard's ErrConflict it took for a busy key), the call fails
// with an error that says so and carries the server's, so that a deadlock
// is run again under the retry policy. fn's own error stays reachable.
func withDeath(tx sqldb.Tx, err error) error {
	dead := tx.Err()
	switch {
	case dead == nil:
		return err
	case err == nil:
		return dead
	}
	return errors.Join(err, dead)
}

// endBy runs call, tx.Commit or tx.Rollback, under ctx, and abandons ctx
// once bound has passed: a driver whose statements end with their ctx then
// returns at once. An answer that came is returned as it is, even if the
// bound passed meanwhile; an error after the bound passed says the outcome
// is unknown.
func endBy(ctx context.Context, abandon context.CancelFunc, bound time.Duration, op string, call func(context.Context) error) error {
	if bound <= 0 {
		bound = DefaultFinishTimeout
	}
	t := time.AfterFunc(bound, abandon)
	err := call(ctx)
	if !t.Stop() && err != nil {
		return fmt.Errorf("%s: %w within %v, the outcome is unknown: %w (%w)", op, ErrNoAnswer, bound, context.DeadlineExceeded, err)
	}
	return err
}

// ender ends a transaction once begun: its COMMIT or ROLLBACK, which gives
// the connection back, within a bound kept by a timer.
type ender struct {
	ctx     context.Context // of the COMMIT or ROLLBACK
	abandon context.CancelFunc
	bound   time.Duration
}

// begin runs BEGIN, watched like any statement of the guard's (see
// [Watch]): when it is given up on, the transaction it may still begin is
// rolled back once it returns. A handle whose statements end with their ctx
// ([sqldb.EndsWithCtx]) needs no watching: its BEGIN, under txCtx, ends
// when ctx does; nor does a ctx that cannot end.
func (e ender) begin(ctx context.Context, d sqldb.DB, txCtx context.Context, opts *sql.TxOptions) (sqldb.OwnTx, error) {
	if !NeedsWatch(ctx, d) {
		return d.Begin(txCtx, opts)
	}
	type begun struct {
		tx  sqldb.OwnTx
		err error
	}
	done := make(chan begun, 1)
	err := Watch(ctx, nil, func() error {
		tx, err := d.Begin(txCtx, opts)
		done <- begun{tx, err}
		return err
	})
	if errors.Is(err, ErrNoAnswer) {
		go func() {
			if r := <-done; r.tx != nil {
				_ = r.tx.Rollback(e.ctx)
			}
			e.abandon()
		}()
		return nil, err
	}
	r := <-done
	return r.tx, r.err
}

// end runs call, tx.Commit or tx.Rollback, and waits for it at most e.bound.
func (e ender) end(op string, call func(context.Context) error) error {
	bound := e.bound
	if bound <= 0 {
		bound = DefaultFinishTimeout
	}
	return Within(op, bound, func() error {
		err := call(e.ctx)
		e.abandon()
		return err
	}, e.abandon)
}

// ErrNoAnswer marks the errors of [Within] and [Watch]: the server's answer
// did not come in time, and the call was left to finish on its own. What the
// call was to write (a scanned row) must not be read; a connection it holds
// must be closed without waiting for it.
var ErrNoAnswer = errors.New("no answer from the server")

// CancelGrace is how long [Watch] waits, after ctx ended, for a statement
// to report that it was cut short.
const CancelGrace = 250 * time.Millisecond

// Watch runs call, a statement sent under ctx on handle h, and returns its
// error. When ctx ends first and call has not returned [CancelGrace] later,
// Watch returns ctx's error (marked [ErrNoAnswer]) and leaves call to finish
// alone. pgx stops reading when ctx ends; lib/pq asks the server to cancel
// the statement and waits for its answer, which a silent network never
// brings, so the caller would wait until the kernel gives up on the
// connection. So call runs on a goroutine of its own, unless h's statements
// end with ctx by themselves ([sqldb.EndsWithCtx]): then Watch runs it
// directly, and it costs what the driver's call costs.
func Watch(ctx context.Context, h any, call func() error) error {
	if !NeedsWatch(ctx, h) {
		return call()
	}
	w := watchers.Get().(*watcher)
	w.call = call
	_, err := w.watch(ctx)
	return err
}

// NeedsWatch reports whether a statement under ctx on handle h would be
// watched by [Watch]: whether ctx can end and h's statements do not end
// with it. A caller that would build a closure for Watch asks first, so
// that the unwatched path, pgx's, costs no closure.
func NeedsWatch(ctx context.Context, h any) bool {
	return ctx.Done() != nil && !sqldb.EndsWithCtx(h)
}

// WatchExec is [Watch] for q.Exec(ctx, query, args...), and WatchStmt for
// s.Exec(ctx, tx, args...) (a statement runs on the database it was
// prepared on, in tx or not, so s tells whether it ends with ctx): the
// statement's count of rows travels with its answer, and the call is no
// closure, so a watched statement costs the goroutine it runs on and no
// other allocation.
func WatchExec(ctx context.Context, q sqldb.Querier, query string, args []any) (int64, error) {
	if !NeedsWatch(ctx, q) {
		return q.Exec(ctx, query, args...)
	}
	w := watchers.Get().(*watcher)
	w.ctx, w.q, w.query, w.args = ctx, q, query, args
	return w.watch(ctx)
}

// WatchStmt: see [WatchExec].
func WatchStmt(ctx context.Context, s sqldb.Stmt, tx sqldb.Tx, args []any) (int64, error) {
	if !NeedsWatch(ctx, s) {
		return s.Exec(ctx, tx, args...)
	}
	w := watchers.Get().(*watcher)
	w.ctx, w.stmt, w.tx, w.args = ctx, s, tx, args
	return w.watch(ctx)
}

// WatchScan is [Watch] for q.QueryRow(ctx, query, args...).Scan(dest...):
// it scans query's first row into dest, or returns an error matching
// [sql.ErrNoRows] when there is none. A read given up on goes on alone, and
// never writes into dest after WatchScan returned: the row is read on the
// watched goroutine, and scanned into dest only under the watcher's mutex,
// while the caller still waits for it. So the caller's variables need no
// copies, and the call no closure: a watched read costs what the driver's
// costs, and the goroutine it runs on.
func WatchScan(ctx context.Context, q sqldb.Querier, query string, args, dest []any) error {
	if !NeedsWatch(ctx, q) {
		return q.QueryRow(ctx, query, args...).Scan(dest...)
	}
	for _, d := range dest {
		if _, ok := d.(*sql.RawBytes); ok {
			// As database/sql's Row.Scan: the bytes would be the driver's,
			// reused once the rows are closed.
			return errors.New("sql: RawBytes isn't allowed on Row.Scan")
		}
	}
	w := watchers.Get().(*watcher)
	w.ctx, w.q, w.query, w.args, w.dest = ctx, q, query, args, dest
	_, err := w.watch(ctx)
	return err
}

// PreferCtx makes a statement's failure match ctx's error when ctx has
// ended. Drivers report a statement that ctx cut short in their own ways:
// pgx's stdlib says driver.ErrBadConn when ctx ended before the statement was
// sent (database/sql retries that on a pool, not on a *sql.Conn or a
// transaction), and a transaction that database/sql rolled back on ctx's end
// says sql.ErrTxDone. Callers match ctx's error, whichever it was.
func PreferCtx(ctx context.Context, err error) error {
	if err == nil || sqldb.NoRows(err) {
		return err
	}
	if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	return err
}

// A watcher runs a watched call on a goroutine of its own: call, or else a
// statement, q's or stmt's, or a read of q's into dest. Watchers are
// reused, channel and all, once their call's answer has been read.
type watcher struct {
	done chan answer // buffered: an abandoned call's answer never blocks
	call func() error

	ctx   context.Context
	q     sqldb.Querier
	query string
	stmt  sqldb.Stmt
	tx    sqldb.Tx
	args  []any
	dest  []any // a read's: the caller's variables

	mu        sync.Mutex // protects abandoned, and dest's variables while the call runs
	abandoned bool       // the caller returned without the answer: dest is not to be written
}

type answer struct {
	n   int64
	err error
}

var watchers = sync.Pool{New: func() any { return &watcher{done: make(chan answer, 1)} }}

func (w *watcher) watch(ctx context.Context) (int64, error) {
	go w.run()
	select {
	case a := <-w.done:
		w.recycle()
		return a.n, a.err
	case <-ctx.Done():
	}
	t := time.NewTimer(CancelGrace)
	defer t.Stop()
	select {
	case a := <-w.done:
		w.recycle()
		return a.n, a.err
	case <-t.C:
		// w stays with the call, whose answer nobody reads; a read in it
		// that has begun to scan is waited for, one that has not never will.
		w.mu.Lock()
		w.abandoned = true
		w.mu.Unlock()
		return 0, fmt.Errorf("%w %v after ctx ended: %w", ErrNoAnswer, CancelGrace, context.Cause(ctx))
	}
}

func (w *watcher) run() {
	var a answer
	switch {
	case w.call != nil:
		a.err = w.call()
	case w.stmt != nil:
		a.n, a.err = w.stmt.Exec(w.ctx, w.tx, w.args...)
	case w.dest != nil:
		a.err = w.scan()
	default:
		a.n, a.err = w.q.Exec(w.ctx, w.query, w.args...)
	}
	w.done <- a
}

// scan is [WatchScan]'s read, as database/sql's Row.Scan does it: the
// network's part (the query, the row, the end of the answer) outside the
// mutex, the scan into the caller's variables inside it, and only while
// the caller waits.
func (w *watcher) scan() error {
	rows, err := w.q.Query(w.ctx, w.query, w.args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	w.mu.Lock()
	if w.abandoned {
		w.mu.Unlock()
		return ErrNoAnswer
	}
	err = rows.Scan(w.dest...)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	// The statement's answer ends without an error.
	return rows.Close()
}

func (w *watcher) recycle() {
	*w = watcher{done: w.done}
	watchers.Put(w)
}

// Within runs call on a goroutine of its own and returns its error, or,
// once bound has passed without an answer, calls giveUp and returns an
// error matching [context.DeadlineExceeded] that names op. call then goes on
// alone until the network call in it returns; giveUp should make that soon
// (cancel the context it runs under). It is for the steps a guard must
// finish after fn, even when ctx has ended: they cannot end with ctx, and
// must not outlast it by more than a stated bound.
func Within(op string, bound time.Duration, call func() error, giveUp func()) error {
	w := watchers.Get().(*watcher)
	w.call = call
	go w.run()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case a := <-w.done:
		w.recycle()
		return a.err
	case <-t.C:
		// w stays with the call, whose answer nobody reads.
		giveUp()
		return fmt.Errorf("%s: %w within %v, the outcome is unknown: %w", op, ErrNoAnswer, bound, context.DeadlineExceeded)
	}
}

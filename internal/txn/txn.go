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
	"reflect"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqlerr"
)

// Beginner is a handle that can begin transactions: [*sql.DB], [*sql.Conn],
// sqlx's DB and Conn, and any wrapper of the caller's with the same BeginTx.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// DefaultFinishTimeout is the default of [Options.FinishTimeout].
const DefaultFinishTimeout = 5 * time.Second

// Options says how [Run] runs its transaction.
type Options struct {
	// Tx is passed to BeginTx; nil means the driver's defaults.
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
	Tx contend.DBTX
	// Pool begins the guard's own transactions; nil when Tx is set.
	Pool Beginner
}

// Owned reports whether the guard owns its transactions.
func (h Handle) Owned() bool { return h.Tx == nil }

// Check reports an error matching [contend.ErrInvalid] unless db is a handle
// whose kind is known: a transaction ([*sql.Tx], sqlx's Tx), run in and
// never committed, or a pool ([*sql.DB], [*sql.Conn], sqlx's DB and Conn,
// anything with [Beginner]'s BeginTx), on which transactions are begun.
//
// Nothing else is guessed at. A wrapper with only [contend.DBTX]'s methods
// might be either; taken for a transaction, its statements would run in
// autocommit: a lock would end with the statement that took it and fn would
// run unlocked.
func Check(db contend.DBTX) error {
	_, err := Classify(db)
	return err
}

// IsNil reports whether db is nil or a typed nil, such as a nil [*sql.DB].
func IsNil(db contend.DBTX) bool {
	if db == nil {
		return true
	}
	switch v := reflect.ValueOf(db); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// Classify says whether db is a transaction to run in or a pool to begin
// on, or, with an error matching [contend.ErrInvalid], neither (see [Check]).
func Classify(db contend.DBTX) (Handle, error) {
	if IsNil(db) {
		return Handle{}, fmt.Errorf("nil db: %w", contend.ErrInvalid)
	}
	switch h := db.(type) {
	case *sql.Tx, *sqlx.Tx:
		return Handle{Tx: h}, nil
	case Beginner:
		return Handle{Pool: h}, nil
	}
	return Handle{}, fmt.Errorf("db is a %T, neither a pool nor a transaction: pass a *sql.DB, *sql.Conn, sqlx's DB "+
		"or anything with BeginTx(ctx, *sql.TxOptions) (*sql.Tx, error) to begin a transaction per call, or a *sql.Tx "+
		"or sqlx's Tx to run inside yours: %w", db, contend.ErrInvalid)
}

// Resolve decides where a call on db runs. A transaction runs the call in
// itself. A pool runs it in the transaction ctx carries ([contend.Querier]:
// fn of another SQL guard, or of an outer call), so nested guards share one
// transaction and the server sees, and breaks, any deadlock between their
// locks; with none, the guard begins its own on the pool.
func Resolve(ctx context.Context, db contend.DBTX) (Handle, error) {
	h, err := Classify(db)
	if err != nil || !h.Owned() {
		return h, err
	}
	outer, err := Outer(ctx)
	if err != nil || outer == nil {
		return h, err
	}
	return Handle{Tx: outer}, nil
}

// Outer returns the transaction ctx carries ([contend.WithQuerier]), or nil
// when it carries none, or a pool. A querier of unknown kind gives an error
// matching [contend.ErrInvalid].
func Outer(ctx context.Context) (contend.DBTX, error) {
	q := contend.Querier(ctx, nil)
	if q == nil {
		return nil, nil
	}
	h, err := Classify(q)
	if err != nil {
		return nil, fmt.Errorf("the querier ctx carries: %w", err)
	}
	// A pool put in ctx with contend.WithQuerier has no transaction to join.
	return h.Tx, nil
}

// Run runs fn inside a transaction and returns the number of attempts and
// the last error. fn's ctx carries the transaction for [contend.Querier].
// Where the transaction comes from is [Resolve]'s decision; a handle of
// unknown kind gives an error matching [contend.ErrInvalid] and runs nothing.
//
// In a transaction of its own, Run commits when fn returns nil and rolls
// back otherwise, also on panic (re-raised). A deadlock or serialization
// failure (SQLSTATE 40P01, 40001), or an error opts.Retryable accepts, rolls
// back and runs the whole transaction again under opts.Retry: an aborted
// PostgreSQL transaction cannot go on, so nothing short of a fresh one can
// succeed.
//
// The COMMIT or ROLLBACK is waited for as long as the server takes to answer,
// so Run never returns while the server still holds the transaction's locks,
// but at most opts.FinishTimeout: a network that went silent (a partition, a
// frozen peer) would otherwise hold Run until the kernel gives up on the
// connection, a quarter of an hour. When the bound passes, Run returns an
// error matching [context.DeadlineExceeded] (after a COMMIT: it may or may not
// have been applied), and the connection is abandoned: closed at once by a
// driver that watches the transaction's context (pgx), or left to the driver
// until its call returns (lib/pq). The server rolls back a transaction whose
// COMMIT it never got, and lets go of its locks, once it notices the session
// is gone (its tcp_keepalives_* and idle_in_transaction_session_timeout
// settings).
//
// BEGIN is watched like a statement (see [Watch]): a call into a silent
// network returns [CancelGrace] after ctx's end, so a call returns within
// ctx's deadline, plus CancelGrace, plus opts.FinishTimeout, as long as fn's
// own statements return when ctx ends.
//
// In a transaction someone else owns, fn runs once, Run neither commits nor
// rolls back, and errors are returned for the owner to handle: only it can
// run its transaction again from the start.
func Run(ctx context.Context, db contend.DBTX, opts Options, fn func(ctx context.Context, tx contend.DBTX) error) (attempts int, err error) {
	h, err := Resolve(ctx, db)
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
		return 1, fn(contend.WithQuerier(ctx, h.Tx), h.Tx)
	}
	retryable := func(err error) bool {
		return sqlerr.Retryable(err) || (opts.Retryable != nil && opts.Retryable(err))
	}
	return opts.Retry.Do(ctx, func(ctx context.Context) error {
		return once(ctx, h.Pool, opts, fn)
	}, retryable)
}

// conner is a pool that hands out a connection of its own: [*sql.DB] and
// sqlx's DB.
type conner interface {
	Conn(ctx context.Context) (*sql.Conn, error)
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
func once(ctx context.Context, b Beginner, opts Options, fn func(context.Context, contend.DBTX) error) (err error) {
	var conn *sql.Conn
	if p, ok := b.(conner); ok {
		if conn, err = p.Conn(ctx); err != nil {
			return err
		}
		b = conn
	}
	// txCtx is cancelled when ctx ends during BEGIN, and when a COMMIT or
	// ROLLBACK outlives its bound: drivers that watch it (pgx) then close the
	// connection instead of waiting for an answer.
	txCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	e := ender{conn: conn, abandon: abandon, bound: opts.FinishTimeout}
	stopWatching := context.AfterFunc(ctx, abandon)
	tx, err := e.begin(ctx, b, txCtx, opts.Tx)
	inTime := stopWatching() // false: ctx ended during BEGIN
	if errors.Is(err, ErrNoAnswer) {
		return err // begin rolls back and releases once BEGIN returns
	}
	if err != nil {
		e.release()
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
	if err := fn(contend.WithQuerier(ctx, tx), tx); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	ended = true
	return e.end("commit", tx.Commit)
}

// ender ends a transaction once begun: its COMMIT or ROLLBACK, then the
// connection given back, within a bound kept by a timer.
type ender struct {
	conn    *sql.Conn // nil when the transaction was begun on the caller's handle
	abandon context.CancelFunc
	bound   time.Duration
}

// begin runs BEGIN, watched like any statement of the guard's (see
// [Watch]): when it is given up on, the transaction it may still begin is
// rolled back and the connection released once it returns.
func (e ender) begin(ctx context.Context, b Beginner, txCtx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	type begun struct {
		tx  *sql.Tx
		err error
	}
	done := make(chan begun, 1)
	err := Watch(ctx, func() error {
		tx, err := b.BeginTx(txCtx, opts)
		done <- begun{tx, err}
		return err
	})
	if errors.Is(err, ErrNoAnswer) {
		go func() {
			if r := <-done; r.tx != nil {
				_ = r.tx.Rollback()
			}
			e.release()
		}()
		return nil, err
	}
	r := <-done
	return r.tx, r.err
}

func (e ender) release() {
	if e.conn != nil {
		// The pool discards a connection the driver reported broken.
		_ = e.conn.Close()
	}
	e.abandon()
}

// end runs call, tx.Commit or tx.Rollback, and waits for it at most e.bound.
func (e ender) end(op string, call func() error) error {
	bound := e.bound
	if bound <= 0 {
		bound = DefaultFinishTimeout
	}
	return Within(op, bound, func() error {
		err := call()
		e.release()
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

// Watch runs call, a statement sent under ctx, and returns its error. When
// ctx ends first and call has not returned [CancelGrace] later, Watch returns
// ctx's error (marked [ErrNoAnswer]) and leaves call to finish alone. pgx
// stops reading when ctx ends; lib/pq asks the server to cancel the
// statement and waits for its answer, which a silent network never brings,
// so the caller would wait until the kernel gives up on the connection.
func Watch(ctx context.Context, call func() error) error {
	if ctx.Done() == nil {
		return call()
	}
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(CancelGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w %v after ctx ended: %w", ErrNoAnswer, CancelGrace, context.Cause(ctx))
	}
}

// Within runs call on a goroutine of its own and returns its error, or,
// once bound has passed without an answer, calls giveUp and returns an
// error matching [context.DeadlineExceeded] that names op. call then goes on
// alone until the network call in it returns; giveUp should make that soon
// (cancel the context it runs under). It is for the steps a guard must
// finish after fn, even when ctx has ended: they cannot end with ctx, and
// must not outlast it by more than a stated bound.
func Within(op string, bound time.Duration, call func() error, giveUp func()) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		giveUp()
		return fmt.Errorf("%s: %w within %v, the outcome is unknown: %w", op, ErrNoAnswer, bound, context.DeadlineExceeded)
	}
}

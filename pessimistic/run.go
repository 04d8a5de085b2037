package pessimistic

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keyline"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
)

// OnHeld says what a lock does when another transaction holds it.
type OnHeld int

const (
	// Wait queues behind the holder until it commits or rolls back, until
	// the lock timeout passes, or until ctx ends. The default.
	Wait OnHeld = iota
	// NoWait gives up at once with an error matching [contend.ErrConflict]
	// (SQL NOWAIT). The server reports it as an error, which aborts the
	// transaction: inside a caller's transaction, the caller must roll back.
	NoWait
	// SkipLocked leaves held rows out instead of waiting for them (SQL SKIP
	// LOCKED), so workers taking rows from one table never queue behind each
	// other: see [Locker.Claim]. A single held row gives
	// [contend.ErrConflict], without aborting the transaction. Rows only;
	// advisory locks have no such policy.
	SkipLocked
)

// String returns the policy as SQL spells it, or "wait".
func (m OnHeld) String() string {
	switch m {
	case Wait:
		return "wait"
	case NoWait:
		return "NOWAIT"
	case SkipLocked:
		return "SKIP LOCKED"
	}
	return "OnHeld(" + strconv.Itoa(int(m)) + ")"
}

// runner is what a [Locker] and an [Advisory] share: where transactions come
// from, how they run, and how a failed lock is told apart from a caller who
// gave up.
type runner struct {
	db      sqldb.DB
	opts    txn.Options
	mode    OnHeld
	timeout time.Duration // 0: the server's lock_timeout applies
	// setTimeout sets the lock timeout: "SET LOCAL lock_timeout = <ms>" on
	// PostgreSQL, setMySQLTimeout's statement on MySQL; "" without a
	// timeout.
	setTimeout string
	observer   contend.Observer // nil: report nothing
	// line queues the calls of one key in the process in front of the
	// lock (LockerConfig.NoLocalQueue); nil when they go to the server at once.
	line *keyline.Lines
}

func newRunner(db contend.DB, mode OnHeld, timeout, finish time.Duration, isolation sql.IsolationLevel, retry contend.Retry, observer contend.Observer) (runner, error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return runner{}, fmt.Errorf("pessimistic: %w", err)
	}
	if timeout < 0 {
		return runner{}, fmt.Errorf("pessimistic: lock timeout %v is negative: %w", timeout, contend.ErrInvalid)
	}
	if finish < 0 {
		return runner{}, fmt.Errorf("pessimistic: finish timeout %v is negative: %w", finish, contend.ErrInvalid)
	}
	r := runner{db: d, mode: mode, timeout: timeout, observer: observer,
		opts: txn.Options{Tx: d.Dialect().GuardTx(isolation), Retry: retry, FinishTimeout: finish}}
	switch {
	case timeout <= 0:
	case d.Dialect() == sqldb.MySQL:
		r.setTimeout = fmt.Sprintf(setMySQLTimeout, timeoutSeconds(timeout))
	default:
		// PostgreSQL counts lock_timeout in whole milliseconds, and 0 turns
		// it off: round up, so a tiny timeout stays a timeout.
		r.setTimeout = "SET LOCAL lock_timeout = " + strconv.FormatInt(timeoutMillis(timeout), 10)
	}
	return r, nil
}

func timeoutMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// timeoutSeconds is d in the whole seconds MySQL counts lock waits in
// (innodb_lock_wait_timeout, GET_LOCK's timeout), rounded up: 0 would mean
// NOWAIT, and a short timeout must stay a wait.
func timeoutSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// lockTimeout is the configured lock timeout as the server applies it.
func (r *runner) lockTimeout() time.Duration {
	if r.db.Dialect() == sqldb.MySQL {
		return time.Duration(timeoutSeconds(r.timeout)) * time.Second
	}
	return r.timeout
}

// run takes the lock with lock, then runs fn, both in one transaction: the
// one ctx carries when the locker works on a pool (a nested call joins the
// transaction of the call around it, so the server sees every lock of the
// caller in one transaction and can detect a deadlock between them), the one
// the locker was built on, or else a new one of its own, retried from the
// start on deadlock and serialization failure. what names the locked keys
// in errors; it is called only when there is an error to report. key is
// the Key of the events reported, made only when there is an Observer.
func (r *runner) run(ctx context.Context, what func() string, key func() string, lock func(context.Context, sqldb.Tx) error, fn func(context.Context, contend.DBTX) error) error {
	return r.runOn(ctx, r.db, "", what, key, lock, fn)
}

// runOn is run with its transactions on db instead of the runner's handle:
// a connection the caller holds for the call (see [Advisory] on MySQL). A
// call with a queued key waits its turn in the runner's line first, when the
// runner has one and the transaction is its own.
func (r *runner) runOn(ctx context.Context, db sqldb.DB, queued string, what func() string, key func() string, lock func(context.Context, sqldb.Tx) error, fn func(context.Context, contend.DBTX) error) error {
	h, err := txn.Resolve(ctx, db)
	if err != nil {
		return fmt.Errorf("pessimistic: lock %s: %w", what(), err)
	}
	var rep *report
	if r.observer != nil {
		rep = &report{o: r.observer, key: key(), max: r.opts.Retry.Attempts(), began: time.Now()}
	}
	// Only a transaction of the runner's own waits in the line: a joined
	// one may already hold the key, and must not wait behind itself.
	if queued != "" && r.line != nil && h.Owned() {
		if err := r.line.Enter(ctx, queued); err != nil {
			err = r.classify(ctx, what, err)
			if rep != nil {
				rep.end(ctx, r.mode, err)
			}
			return err
		}
		// Held across the retries: a deadlock's rerun keeps its turn.
		defer r.line.Exit(queued)
	}
	attempt := func(ctx context.Context, tx sqldb.Tx) error {
		// Watched: a lock statement the network swallowed must not hold the
		// call past ctx (the rollback that follows is bounded too).
		var err error
		if !txn.NeedsWatch(ctx, tx) {
			err = r.lock(ctx, tx, h.Owned(), lock) // no closure to allocate
		} else {
			err = txn.Watch(ctx, tx, func() error { return r.lock(ctx, tx, h.Owned(), lock) })
		}
		if err != nil {
			if rep != nil {
				rep.lockErr = err
			}
			return r.classify(ctx, what, err)
		}
		if rep != nil {
			rep.obtained(ctx)
		}
		return fn(ctx, tx.DBTX())
	}
	if rep == nil {
		_, err = txn.RunTx(ctx, db, r.opts, attempt)
	} else {
		err = r.runObserved(ctx, db, h, rep, attempt)
	}
	if err != nil && sqlerr.Retryable(err) && !errors.Is(err, contend.ErrConflict) && context.Cause(ctx) == nil {
		// fn's own statement was the deadlock victim (or, in a transaction
		// not ours, any statement was): the transaction is aborted and only
		// running it again from the start can succeed. When ctx ended, the
		// caller gave up, and the error already says so.
		err = fmt.Errorf("pessimistic: %s: transaction must be run again: %w (%w)", what(), contend.ErrConflict, err)
	}
	return err
}

// lock runs lock under the configured lock timeout. In a transaction of its
// own the timeout is set for the whole transaction, fn's statements included
// (SET LOCAL: it ends with the transaction). In a caller's transaction it
// covers this lock only: the caller's setting is put back after it, whether
// the lock was had or not, so the locker leaves no setting behind in a
// transaction it does not own. Only a lock the server answered with an error
// skips that: the error aborted the transaction, and the rollback the caller
// must make (to a savepoint or of the whole transaction) undoes the setting.
func (r *runner) lock(ctx context.Context, tx sqldb.Tx, owned bool, lock func(context.Context, sqldb.Tx) error) error {
	if r.setTimeout == "" {
		return lock(ctx, tx)
	}
	if r.db.Dialect() == sqldb.MySQL {
		return r.lockMySQL(ctx, tx, lock)
	}
	if owned {
		if _, err := tx.Exec(ctx, r.setTimeout); err != nil {
			return fmt.Errorf("set lock_timeout: %w", err)
		}
		return lock(ctx, tx)
	}
	var prev, set string
	err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`,
		strconv.FormatInt(timeoutMillis(r.timeout), 10)).Scan(&prev, &set)
	if err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	err = lock(ctx, tx)
	if sqlerr.Code(err) != "" {
		return err
	}
	if _, rerr := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, prev); rerr != nil {
		return errors.Join(err, fmt.Errorf("restore lock_timeout: %w", rerr))
	}
	return err
}

// classify turns a failed lock into the error the caller branches on.
//
// PostgreSQL reports NOWAIT and lock_timeout alike (55P03), and a client's
// cancel and statement_timeout alike (57014), so the code alone cannot say
// whether the race was lost or the caller gave up: ctx is checked first (an
// ended ctx is the caller giving up, whatever the server said: the error
// then matches both ctx's error and [contend.ErrConflict]), and a 55P03
// is then a lost race because this locker sent NOWAIT or a lock timeout (or
// the server has a lock_timeout of its own configured). A 57014 with ctx alive
// is a statement_timeout: a backend error, not a lost race.
func (r *runner) classify(ctx context.Context, what func() string, err error) error {
	if errors.Is(err, contend.ErrNotFound) || errors.Is(err, contend.ErrConflict) {
		// The lock statement ran and answered: no row, or held under SKIP
		// LOCKED. ctx does not change that answer.
		return fmt.Errorf("pessimistic: lock %s: %w", what(), err)
	}
	if cerr := context.Cause(ctx); cerr != nil {
		// The lock was still not had when the caller gave up: a lost race,
		// as distlock reports a wait that ctx ended, and the caller's own
		// error, so that either test matches.
		if errors.Is(err, cerr) {
			return fmt.Errorf("pessimistic: lock %s: waited until ctx ended: %w (%w)", what(), contend.ErrConflict, err)
		}
		return fmt.Errorf("pessimistic: lock %s: waited until ctx ended: %w (%w: %w)", what(), contend.ErrConflict, cerr, err)
	}
	var why string
	switch sqlerr.Code(err) {
	case sqlerr.LockNotAvailable:
		switch {
		case r.mode == NoWait:
			why = "held by another transaction (NOWAIT)"
		case r.timeout > 0:
			why = "still held after the lock timeout of " + r.lockTimeout().String()
		default:
			why = "not available within the server's lock_timeout"
		}
	case sqlerr.DeadlockDetected:
		why = "deadlock, the transaction must be run again"
	case sqlerr.SerializationFailure:
		why = "serialization failure, the transaction must be run again"
	default:
		return fmt.Errorf("pessimistic: lock %s: %w", what(), err)
	}
	return fmt.Errorf("pessimistic: lock %s: %s: %w (%w)", what(), why, contend.ErrConflict, err)
}

// The lock timeout on MySQL is innodb_lock_wait_timeout, a variable of the
// session, in whole seconds, which outlives the transaction: set for the
// lock and left, it would go back to the pool with the connection and bound
// the waits of whoever uses it next. So it is set right before the lock
// statement and put back right after it, in one statement each, whatever
// the lock did (a lock wait timeout undoes the statement, a deadlock the
// transaction; neither ends the session). It covers the lock only, in a
// transaction of the locker's or the caller's alike.
//
// SET STATEMENT ... FOR would need no restoring, but only MariaDB has it;
// these two statements run on MySQL 8 as well.
const (
	setMySQLTimeout = "SET @contend_lock_wait_timeout = @@SESSION.innodb_lock_wait_timeout, " +
		"SESSION innodb_lock_wait_timeout = %d"
	restoreMySQLTimeout = "SET SESSION innodb_lock_wait_timeout = @contend_lock_wait_timeout, " +
		"@contend_lock_wait_timeout = NULL"
)

// lockMySQL runs lock under innodb_lock_wait_timeout set for it (see
// setMySQLTimeout). The setting is put back even when ctx ended during the
// lock, under a grace of its own, unless the connection is gone: then the
// driver closed it (go-sql-driver/mysql does when a statement's ctx ends),
// and the pool discards it with its setting. Either way no connection goes
// back to the pool with the locker's setting.
func (r *runner) lockMySQL(ctx context.Context, tx sqldb.Tx, lock func(context.Context, sqldb.Tx) error) error {
	if _, err := tx.Exec(ctx, r.setTimeout); err != nil {
		return fmt.Errorf("set innodb_lock_wait_timeout: %w", err)
	}
	err := lock(ctx, tx)
	restoreCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		restoreCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), txn.CancelGrace)
		defer cancel()
	}
	// Put back even when the lock's deadlock rolled the transaction back:
	// the setting belongs to the session.
	if rerr := sqldb.SessionExec(restoreCtx, tx, restoreMySQLTimeout); rerr != nil && !errors.Is(rerr, driver.ErrBadConn) {
		return errors.Join(err, fmt.Errorf("restore innodb_lock_wait_timeout: %w", rerr))
	}
	return err
}

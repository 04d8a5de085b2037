package pessimistic

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// On MySQL and MariaDB the advisory lock is GET_LOCK's, which belongs to the
// session, not to a transaction: commit and rollback leave it held, and a
// pooled connection given back while it holds one keeps it, so the next
// user of that connection "holds" the key without having asked and nobody
// else can get it. The guard therefore holds one connection of the pool for
// the whole call (a *sql.Conn), takes the lock on it, runs fn's transaction
// on it, releases the lock after the transaction ends, and gives the
// connection back only when the server said the session holds no lock. On every
// other path (a lost answer, a broken connection, a release that failed or
// did not answer in time) it discards the connection instead: the server
// drops a session's locks when the session ends.
//
// The name is the server's CONCAT('contend:', SHA2(key, 224)): 8 + 56
// characters, MySQL's limit of 64, for keys of any length, computed by the
// server like PostgreSQL's hashtextextended, so that any client using the
// same expression excludes and is excluded by the guard. A key always gives
// the same name, so two callers of one key always meet on one lock; two keys
// whose hashes collided would only wait for each other.
const (
	getLock = "SELECT GET_LOCK(CONCAT('contend:', SHA2(?, 224)), ?)"
	// releaseLock releases every named lock of the session, ours and any
	// other (one that fn took on the call's connection and kept, or that
	// the session held before the call: GET_LOCK is reentrant), so that an
	// answer means the session holds none and its connection can go back
	// to the pool; the count it returns is not needed, so DO discards it
	// and the answer is an OK, no row to read. Taking no argument, it is a
	// single round trip: a statement with arguments is prepared, then run,
	// unless the DSN asks go-sql-driver/mysql to interpolate them.
	releaseLock = "DO RELEASE_ALL_LOCKS()"
)

// maxLockWait is GET_LOCK's timeout when neither ctx nor the guard bounds
// the wait: a year, the server's "forever" (MariaDB answers NULL to a
// negative timeout, which MySQL takes for no limit).
const maxLockWait = 365 * 24 * time.Hour

func newMySQLAdvisory(r runner) (*Advisory, error) {
	pool, ok := sqldb.PoolOf(r.db)
	if !ok {
		return nil, fmt.Errorf("pessimistic: advisory on MySQL takes a pool (*sql.DB or sqlx's DB, wrapped by mysqldb.Wrap): "+
			"its lock belongs to a session, not to a transaction, so the guard holds a connection of its own for each call; "+
			"in a transaction or on one connection, calls would share one session, and a session's lock does not exclude "+
			"the session itself: %w", contend.ErrInvalid)
	}
	// The guard's GET_LOCK carries the timeout itself.
	r.setTimeout = ""
	// READ COMMITTED, for the reason the Locker begins there (see
	// newMySQLLocker): a Locker nested in fn joins this transaction.
	if r.opts.Tx == nil {
		r.opts.Tx = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return &Advisory{r: r, pool: pool}, nil
}

// lockSession is Lock on MySQL: see getLock. A call nested in another
// guard's fn is refused, since it cannot join that transaction: its lock
// would be released when fn returns, before that transaction commits.
func (a *Advisory) lockSession(ctx context.Context, key string, what func() string, fn func(context.Context, contend.DBTX) error) (err error) {
	outer, err := a.r.db.Outer(ctx)
	if err == nil && outer != nil {
		err = fmt.Errorf("ctx carries a transaction: on MySQL an advisory lock belongs to a session, so it cannot join "+
			"that transaction, and released when fn returns it would not cover the transaction's commit: "+
			"take it before the transaction, and run the transaction in fn: %w", contend.ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("pessimistic: lock %s: %w", what(), err)
	}
	c, err := a.pool.Conn(ctx)
	if err != nil {
		return fmt.Errorf("pessimistic: lock %s: %w", what(), err)
	}
	s := &session{conn: c, key: key, mode: a.r.mode, timeout: a.r.timeout}
	defer func() { s.end(finishTimeout(a.r.opts), err) }()
	return a.r.runOn(ctx, sqldb.Pinned(a.r.db, c), "", what, func() string { return key }, s.lock, func(ctx context.Context, tx contend.DBTX) error {
		defer s.fnReturned(finishTimeout(a.r.opts))
		return fn(ctx, tx)
	})
}

func finishTimeout(o txn.Options) time.Duration {
	if o.FinishTimeout > 0 {
		return o.FinishTimeout
	}
	return txn.DefaultFinishTimeout
}

// A session is one call's connection and what its session holds.
type session struct {
	conn    *sql.Conn
	key     string
	mode    OnHeld
	timeout time.Duration

	// finishBy is when the lock must be released: the finish bound after fn
	// returned, shared with the transaction's COMMIT or ROLLBACK. Set and
	// read on the caller's goroutine.
	finishBy time.Time

	mu sync.Mutex // guards state: a GET_LOCK given up on may answer later
	// state is what the session holds: nothing, the lock, or, while
	// GET_LOCK has not answered, maybe the lock.
	state lockState
}

type lockState int

const (
	free lockState = iota
	held
	unsure
)

// lock is the lock of each of the call's transactions: GET_LOCK in the
// first, nothing in a run again after a deadlock, which the lock, still
// held, covers too. It waits as long as the guard and ctx allow: the
// timeout given to the server is the lock timeout, ctx's deadline a second
// past it (the client's ctx ends the wait first: go-sql-driver/mysql closes
// the connection, and a wait the network cut off still ends on the server),
// or else [maxLockWait]. A wait ctx cancelled leaves nothing behind: the
// server ends the session of a closed connection, its wait with it.
func (s *session) lock(ctx context.Context, tx sqldb.Tx) error {
	if s.get() == held {
		return nil
	}
	secs := int64(0) // NoWait
	if s.mode == Wait {
		wait := maxLockWait
		if s.timeout > 0 {
			wait = s.timeout
		}
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d)+time.Second)
		}
		secs = timeoutSeconds(wait)
	}
	s.set(unsure)
	var got sql.NullInt64
	if err := tx.QueryRow(ctx, getLock, s.key, secs).Scan(&got); err != nil {
		return err // unsure: the answer may have been lost
	}
	switch {
	case !got.Valid:
		s.set(free)
		return fmt.Errorf("GET_LOCK answered NULL: the wait was interrupted")
	case got.Int64 == 0:
		s.set(free)
		wait := time.Duration(secs) * time.Second
		switch {
		case s.mode == NoWait:
			return fmt.Errorf("held by another session: %w", contend.ErrConflict)
		case s.timeout > 0:
			return fmt.Errorf("still held after the lock timeout of %v: %w", wait, contend.ErrConflict)
		}
		return fmt.Errorf("still held when GET_LOCK's wait of %v ran out: %w", wait, contend.ErrConflict)
	}
	s.set(held)
	return nil
}

func (s *session) get() lockState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *session) set(st lockState) {
	s.mu.Lock()
	s.state = st
	s.mu.Unlock()
}

func (s *session) fnReturned(bound time.Duration) { s.finishBy = time.Now().Add(bound) }

// end releases the lock and gives the connection back, or discards it,
// within what is left of the finish bound. txErr is what the call's
// transaction came to. When it ended with the server's answer, nothing
// else uses the connection, and the release runs here under a deadline:
// go-sql-driver/mysql closes the connection when the deadline passes (a
// network gone silent), and the release, failed, discards it. Otherwise
// (a COMMIT or ROLLBACK given up on, still waiting on the connection) the
// release waits behind it, so it goes on alone past the bound, until the
// connection answers or breaks, and discards the connection when it must.
func (s *session) end(bound time.Duration, txErr error) {
	by := s.finishBy
	if by.IsZero() {
		by = time.Now().Add(bound)
	}
	ctx, cancel := context.WithDeadline(context.Background(), by)
	if !errors.Is(txErr, txn.ErrNoAnswer) {
		defer cancel()
		s.release(ctx)
		return
	}
	_ = txn.Within("release", time.Until(by), func() error {
		defer cancel()
		s.release(ctx)
		return nil
	}, cancel)
}

// release gives the connection back when its session holds nothing, and
// else releases its named locks first (see releaseLock); anything short of
// the server's word that the session no longer holds any discards the
// connection.
func (s *session) release(ctx context.Context) {
	switch s.get() {
	case free:
		_ = s.conn.Close()
		return
	case held:
		if _, err := s.conn.ExecContext(ctx, releaseLock); err == nil {
			s.set(free)
			_ = s.conn.Close()
			return
		}
	}
	sqldb.Discard(s.conn)
}

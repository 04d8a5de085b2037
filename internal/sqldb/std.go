package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"sync"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqlerr"
)

// Beginner is a database/sql handle that can begin transactions:
// [*sql.DB], [*sql.Conn], sqlx's DB and Conn, and any wrapper of the
// caller's with the same BeginTx.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// ConnPool is a pool that hands out connections of its own: [*sql.DB] and
// sqlx's DB.
type ConnPool interface {
	Conn(ctx context.Context) (*sql.Conn, error)
}

// PoolOf returns the database/sql pool d is, when it hands out connections
// of its own ([ConnPool]): for statements whose effects belong to a session
// rather than to a transaction, which must run on one connection held for
// the purpose. ok is false for a transaction, a single connection, a
// wrapper of the caller's, and pgx.
func PoolOf(d DB) (p ConnPool, ok bool) {
	s, ok := unwrap(d).(stdDB)
	if !ok || s.tx != nil {
		return nil, false
	}
	p, ok = s.db.(ConnPool)
	return p, ok
}

// Pinned returns d, a pool that [PoolOf] returned, with its statements and
// transactions on c, one of its connections: the same dialect and driver,
// with nothing to ask the driver again.
func Pinned(d DB, c *sql.Conn) DB {
	s := unwrap(d).(stdDB)
	s.db = c
	return s
}

// unwrap returns the handle a driver package's DB wraps (mysqldb's, which
// checks the DSN before its first statement), or d itself.
func unwrap(d DB) DB {
	if w, ok := d.(interface{ Unwrap() DB }); ok {
		return w.Unwrap()
	}
	return d
}

// Discard closes c and has its pool close the connection instead of keeping
// it, so that no later user of the pool inherits its session: one that may
// hold a session-level lock, or whose state is unknown. It waits for a
// statement still running on c; the server ends the session, and lets go of
// what it held, once it sees the connection close.
func Discard(c *sql.Conn) {
	// An error of driver.ErrBadConn from Raw is the documented way to have
	// database/sql close the connection rather than pool it.
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
}

type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// openStd classifies a database/sql handle: a transaction ([*sql.Tx],
// sqlx's Tx), run in and never committed, or a pool (anything with
// [Beginner]'s BeginTx), on which transactions are begun. Nothing else is
// guessed at: a wrapper with only [contend.DBTX]'s methods might be either,
// and taken for a transaction its statements would run in autocommit, a
// lock ending with the statement that took it.
func openStd(db contend.DBTX) (DB, error) {
	if err := refuseBareMySQL(db); err != nil {
		return nil, err
	}
	return classifyStd(db)
}

// classifyStd is openStd for a handle of any dialect: PostgreSQL unless
// the caller sets another. A transaction a guard began, as fn's ctx
// carries it, is itself, shared; a *sql.Conn or sqlx's Conn is marked as
// one session (see [Open]).
func classifyStd(db contend.DBTX) (stdDB, error) {
	switch h := db.(type) {
	case *stdTx:
		return stdDB{stdQuerier: stdQuerier{h, h.ends}, tx: h, dialect: h.dialect}, nil
	case *sql.Tx, *sqlx.Tx:
		t := &stdTx{stdQuerier: stdQuerier{h, false}}
		return stdDB{stdQuerier: stdQuerier{t, false}, tx: t}, nil
	case Beginner:
		pgx := pgxStdlib(db)
		d := stdDB{stdQuerier: stdQuerier{db, pgx}, txEnds: pgx}
		switch h := db.(type) {
		case *sql.DB:
			d.pool = h
		case *sqlx.DB:
			d.pool = h.DB
		case *sql.Conn, *sqlx.Conn:
			d.session = true
		}
		return d, nil
	}
	return stdDB{}, fmt.Errorf("db is a %T, neither a pool nor a transaction: pass a *sql.DB, sqlx's DB "+
		"or anything with BeginTx(ctx, *sql.TxOptions) (*sql.Tx, error) to begin a transaction per call, or a *sql.Tx "+
		"or sqlx's Tx to run inside yours: %w", db, contend.ErrInvalid)
}

type stdQuerier struct {
	db   contend.DBTX
	ends bool // statements end with their ctx (pgx's driver)
}

func (q stdQuerier) StatementsEndWithCtx() bool { return q.ends }

// pgxStdlib reports whether h is a pool of pgx's database/sql driver, whose
// statements end with their ctx (see [EndsWithCtx]). Only a pool tells its
// driver; a transaction or a connection is taken to be lib/pq's, which
// costs a watch per statement and nothing else.
func pgxStdlib(h any) bool {
	d, ok := h.(interface{ Driver() driver.Driver })
	if !ok {
		return false
	}
	t := reflect.TypeOf(d.Driver())
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "github.com/jackc/pgx/v5/stdlib"
}

func (q stdQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q stdQuerier) QueryRow(ctx context.Context, query string, args ...any) Row {
	return q.db.QueryRowContext(ctx, query, args...)
}

func (q stdQuerier) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	r, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// stdDB is a database/sql handle: a pool when tx is nil.
type stdDB struct {
	stdQuerier
	tx      *stdTx
	dialect Dialect
	// txEnds: a transaction's COMMIT and ROLLBACK end with the ctx it
	// began under (see [TxEndsWithCtx]): pgx's driver's do.
	txEnds bool
	// pool is the *sql.DB the handle is, or draws on: what tells two
	// databases apart. nil for a transaction, and for a wrapper of the
	// caller's, which does not say.
	pool *sql.DB
	// session: the handle is one connection, one server session.
	session bool
}

func (d stdDB) TxEndsWithCtx() bool { return d.txEnds }

func (d stdDB) OneSession() bool { return d.session }

func (d stdDB) Dialect() Dialect { return d.dialect }

// withDialect returns d, and its transaction, in dialect.
func (d stdDB) withDialect(dialect Dialect) stdDB {
	d.dialect = dialect
	if d.tx != nil && d.tx.pool == nil {
		d.tx.dialect = dialect
	}
	return d
}

func (d stdDB) Tx() Tx {
	if d.tx == nil {
		return nil
	}
	return d.tx
}

// Outer joins the transaction ctx carries: the one value every guard and
// fn of the call shares, so that what one learns of it (the server rolled
// it back) all see. A transaction begun on another database than d's
// cannot be joined; a caller's *sql.Tx does not say where it was begun.
func (d stdDB) Outer(ctx context.Context) (Tx, error) {
	if TxFrom(ctx) != nil {
		return nil, ErrOtherDriver("database/sql", "pgx")
	}
	q := contend.Querier(ctx, nil)
	if q == nil {
		return nil, nil
	}
	h, err := classifyStd(q)
	if err != nil {
		return nil, fmt.Errorf("the querier ctx carries: %w", err)
	}
	if h.tx == nil {
		// A pool put in ctx with contend.WithQuerier has no transaction to join.
		return nil, nil
	}
	if _, shared := q.(*stdTx); !shared {
		// A caller's *sql.Tx, which does not say its database.
		h.tx.dialect = d.dialect
	} else if h.tx.dialect != d.dialect || (d.pool != nil && h.tx.pool != nil && h.tx.pool != d.pool) {
		return nil, fmt.Errorf("ctx carries a transaction of another database than this handle's (another *sql.DB): "+
			"a guard cannot join it, and running beside it could wait for a lock the caller holds: %w", contend.ErrInvalid)
	}
	return h.tx, nil
}

// Begin begins on the handle, a pool or a connection: the transaction's
// end gives its connection back, and the pool discards one the driver
// reported broken.
//
// database/sql rolls back a transaction whose ctx ends on a goroutine of
// its own and lets the caller go on at once, before the server has let go
// of the transaction's locks; callers (txn) therefore begin on a ctx that
// the caller's end does not cancel, and roll back themselves.
func (d stdDB) Begin(ctx context.Context, opts *sql.TxOptions) (OwnTx, error) {
	b, ok := d.db.(Beginner)
	if !ok || d.tx != nil {
		return nil, fmt.Errorf("begin on a transaction: %w", contend.ErrInvalid)
	}
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &stdOwnTx{stdTx: stdTx{stdQuerier: stdQuerier{tx, d.ends}, pool: d.pool, dialect: d.dialect}, tx: tx}, nil
}

func (d stdDB) Acquire(ctx context.Context) (Conn, error) {
	p, ok := d.db.(ConnPool)
	if !ok {
		return handleConn{d.stdQuerier}, nil
	}
	c, err := p.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if d.ends {
		return endingPoolConn{poolConn{c}}, nil
	}
	return poolConn{c}, nil
}

func (d stdDB) Prepare(ctx context.Context, query string) (Stmt, error) {
	p, ok := d.db.(preparer)
	if !ok {
		return nil, fmt.Errorf("a %T cannot prepare statements: %w", d.db, contend.ErrInvalid)
	}
	s, err := p.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return stdStmt{s, d.ends}, nil
}

// handleConn is [stdDB.Acquire]'s answer on a handle that is one
// connection already (a *sql.Conn, or a wrapper of the caller's): the
// handle itself, not the library's to give back.
type handleConn struct{ stdQuerier }

func (handleConn) Release() {}

// poolConn is a connection [stdDB.Acquire] took from a pool, which Release
// gives back; endingPoolConn is one whose statements end with their ctx
// (see [EndsWithCtx]). Each is a single pointer, so that handing one out as
// a [Conn] allocates nothing: a Store's Update takes one per attempt.
type poolConn struct{ c *sql.Conn }

type endingPoolConn struct{ poolConn }

func (endingPoolConn) StatementsEndWithCtx() bool { return true }

func (p poolConn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return stdQuerier{db: p.c}.Exec(ctx, query, args...)
}

func (p poolConn) QueryRow(ctx context.Context, query string, args ...any) Row {
	return stdQuerier{db: p.c}.QueryRow(ctx, query, args...)
}

func (p poolConn) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	return stdQuerier{db: p.c}.Query(ctx, query, args...)
}

func (p poolConn) Release() { _ = p.c.Close() }

// stdTx is a database/sql transaction, a *sql.Tx or sqlx's Tx, and what
// the goroutines that run statements in it know of it together. It is the
// value fn's ctx carries, as fn's [contend.DBTX]: fn's statements and a
// nested guard's all run through it, so that once one of them finds the
// transaction rolled back by the server, every later one fails, and the
// guard that owns it does not commit.
type stdTx struct {
	stdQuerier // db is the *sql.Tx or sqlx's Tx
	pool       *sql.DB
	dialect    Dialect

	mu   sync.Mutex // protects dead
	dead error      // why the server rolled the transaction back; set once
}

func (t *stdTx) Context(ctx context.Context) context.Context {
	return contend.WithQuerier(ctx, t)
}

func (t *stdTx) DBTX() contend.DBTX { return t }

// Err returns nil while the transaction may still commit, and else an error
// that says the server rolled it back, wrapping the error that did.
func (t *stdTx) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dead
}

// rolledBack records that the server rolled the transaction back, with
// cause, the error of the statement that did. The first cause stays.
func (t *stdTx) rolledBack(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead == nil {
		t.dead = fmt.Errorf("the server rolled the transaction back, nothing it did stays, run it again from the start: %w", cause)
	}
}

// end rolls back the *sql.Tx of a transaction the server rolled back, so
// that a statement sent on it afterwards fails (sql.ErrTxDone) rather than
// run alone in autocommit, and its owner's Commit fails: for a *sql.Tx
// that is not reached through t alone (the caller's), and for the row of
// [stdTx.QueryRowContext]. The connection goes back to its pool.
func (t *stdTx) end() {
	if r, ok := t.db.(interface{ Rollback() error }); ok {
		_ = r.Rollback()
	}
}

// failed learns from err, the error of a statement in t, whether the
// server rolled t back (see [mysqlRolledBack]). PostgreSQL aborts the
// transaction on any error, refuses every later statement in it until a
// rollback (to a savepoint, which may revive it) and answers COMMIT with a
// rollback: it needs no help.
func (t *stdTx) failed(ctx context.Context, err error) {
	if t.dialect != MySQL {
		return
	}
	if cause, dead := mysqlRolledBack(err, func() (bool, error) { return t.inTransaction(ctx) }); dead {
		t.rolledBack(cause)
	}
}

// inTransaction asks the server whether t's session is still in a
// transaction: MariaDB's @@in_transaction, which MySQL 8 does not have.
func (t *stdTx) inTransaction(ctx context.Context) (bool, error) {
	var open int
	if err := t.db.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&open); err != nil {
		return false, err
	}
	return open != 0, nil
}

// mysqlRolledBack classifies err, the error of a statement in a MySQL or
// MariaDB transaction: dead reports whether the server rolled the whole
// transaction back, or may have, and cause is the error to record for it.
// A deadlock (1213) does. So may a lock wait timeout (1205, with
// innodb_rollback_on_timeout) or another error: after any server error but
// a duplicate key, which rolls back its statement only, open asks the
// server whether the transaction is still open. When the server cannot
// say (MySQL 8 has no @@in_transaction: 1193, unknown system variable; or
// ctx ended, or the connection broke), the transaction is taken for dead:
// refusing a live one costs the caller a retry, committing the rest of a
// dead one in autocommit loses writes. An error that is not the server's
// (the driver's, ctx's) leaves the transaction as it was.
func mysqlRolledBack(err error, open func() (bool, error)) (cause error, dead bool) {
	n, ok := sqlerr.MySQLNumber(err)
	switch {
	case !ok || n == sqlerr.MySQLDupEntry:
		return nil, false
	case n == sqlerr.MySQLDeadlock:
		return err, true
	}
	in, askErr := open()
	switch {
	case askErr != nil:
		return fmt.Errorf("%w (and whether the server rolled the transaction back for it is unknown, "+
			"so it is taken as rolled back: %w)", err, askErr), true
	case !in:
		return err, true
	}
	return nil, false
}

func (t *stdTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := t.Err(); err != nil {
		return nil, err
	}
	res, err := t.db.ExecContext(ctx, query, args...)
	if err != nil {
		t.failed(ctx, err)
	}
	return res, err
}

func (t *stdTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := t.Err(); err != nil {
		return nil, err
	}
	rows, err := t.db.QueryContext(ctx, query, args...)
	if err != nil {
		t.failed(ctx, err)
	}
	return rows, err
}

// QueryRowContext's *sql.Row can carry no error of the library's: in a
// transaction the server rolled back, the *sql.Tx is rolled back first, and
// its row says so (sql.ErrTxDone) without a round trip.
func (t *stdTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if t.Err() != nil {
		t.end()
	}
	row := t.db.QueryRowContext(ctx, query, args...)
	if err := row.Err(); err != nil {
		t.failed(ctx, err)
	}
	return row
}

func (t *stdTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := t.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t *stdTx) QueryRow(ctx context.Context, query string, args ...any) Row {
	return t.QueryRowContext(ctx, query, args...)
}

func (t *stdTx) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	r, err := t.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (t *stdTx) std() *stdTx { return t }

// stdOf returns the database/sql transaction tx is, seeing through a
// driver package's wrapper of it (mysqldb's, which checks the DSN before
// its first statement).
func stdOf(tx Tx) (*stdTx, bool) {
	if w, ok := tx.(interface{ Unwrap() Tx }); ok {
		tx = w.Unwrap()
	}
	t, ok := tx.(interface{ std() *stdTx })
	if !ok {
		return nil, false
	}
	return t.std(), true
}

// SessionExec runs query in tx even when the server has rolled tx back: a
// statement about the session, not the transaction (a session variable put
// back), which a rollback does not undo and which must reach the
// connection before it goes back to its pool.
func SessionExec(ctx context.Context, tx Tx, query string) error {
	var q Querier = tx
	if t, ok := stdOf(tx); ok {
		q = t.stdQuerier
	}
	_, err := q.Exec(ctx, query)
	return err
}

// EndDead ends tx's database/sql transaction when the server has rolled
// it back, so that nothing more runs in it, through any handle, and its
// owner's Commit fails. For a guard that found a transaction it does not
// own dead; the owner of one ends it by rolling it back.
func EndDead(tx Tx) {
	if t, ok := stdOf(tx); ok && tx.Err() != nil {
		t.end()
	}
}

type stdOwnTx struct {
	stdTx
	tx *sql.Tx
}

// Commit ignores ctx: database/sql ends a transaction under the ctx it
// was begun with. The connection goes back to the pool, which discards it
// when the driver reported it broken.
func (t *stdOwnTx) Commit(context.Context) error { return t.tx.Commit() }

func (t *stdOwnTx) Rollback(context.Context) error { return t.tx.Rollback() }

type stdStmt struct {
	s    *sql.Stmt
	ends bool // of the pool it was prepared on, whose transactions it runs in
}

func (s stdStmt) StatementsEndWithCtx() bool { return s.ends }

// in returns s as it runs in tx, a transaction of this package's (a
// statement prepared on the pool runs in a transaction through
// StmtContext), or else the error that says tx is dead.
func (s stdStmt) in(ctx context.Context, tx Tx) (*sql.Stmt, *stdTx, error) {
	if tx == nil {
		return s.s, nil, nil
	}
	st, ok := stdOf(tx)
	if !ok {
		return nil, nil, fmt.Errorf("the transaction is a %T, which cannot run prepared statements: %w", tx, contend.ErrInvalid)
	}
	in, ok := st.db.(interface {
		StmtContext(ctx context.Context, s *sql.Stmt) *sql.Stmt
	})
	if !ok {
		return nil, nil, fmt.Errorf("the transaction is a %T, which cannot run prepared statements: %w", st.db, contend.ErrInvalid)
	}
	if err := st.Err(); err != nil {
		return nil, nil, err
	}
	return in.StmtContext(ctx, s.s), st, nil
}

func (s stdStmt) Exec(ctx context.Context, tx Tx, args ...any) (int64, error) {
	st, t, err := s.in(ctx, tx)
	if err != nil {
		return 0, err
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		if t != nil {
			t.failed(ctx, err)
		}
		return 0, err
	}
	return res.RowsAffected()
}

func (s stdStmt) QueryRow(ctx context.Context, tx Tx, args ...any) Row {
	st, t, err := s.in(ctx, tx)
	if err != nil {
		return errRow{err}
	}
	row := st.QueryRowContext(ctx, args...)
	if t != nil {
		if err := row.Err(); err != nil {
			t.failed(ctx, err)
		}
	}
	return row
}

func (s stdStmt) Close() error { return s.s.Close() }

// errRow is a Row whose Scan reports err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

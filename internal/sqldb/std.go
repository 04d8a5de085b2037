package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
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
// the caller sets another.
func classifyStd(db contend.DBTX) (stdDB, error) {
	switch h := db.(type) {
	case *sql.Tx, *sqlx.Tx:
		return stdDB{stdQuerier: stdQuerier{h, false}, tx: &stdTx{stdQuerier{h, false}}}, nil
	case Beginner:
		pgx := pgxStdlib(db)
		return stdDB{stdQuerier: stdQuerier{db, pgx}, txEnds: pgx}, nil
	}
	return stdDB{}, fmt.Errorf("db is a %T, neither a pool nor a transaction: pass a *sql.DB, *sql.Conn, sqlx's DB "+
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
}

func (d stdDB) TxEndsWithCtx() bool { return d.txEnds }

func (d stdDB) Dialect() Dialect { return d.dialect }

func (d stdDB) Tx() Tx {
	if d.tx == nil {
		return nil
	}
	return d.tx
}

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
	// A pool put in ctx with contend.WithQuerier has no transaction to join.
	return h.Tx(), nil
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
	return &stdOwnTx{stdTx: stdTx{stdQuerier{tx, d.ends}}, tx: tx}, nil
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

// stdTx is a database/sql transaction: a *sql.Tx or sqlx's Tx.
type stdTx struct{ stdQuerier }

func (t *stdTx) Context(ctx context.Context) context.Context {
	return contend.WithQuerier(ctx, t.db)
}

func (t *stdTx) DBTX() contend.DBTX { return t.db }

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

// in returns s as it runs in tx: a statement prepared on the pool runs in
// a transaction through StmtContext.
func (s stdStmt) in(ctx context.Context, tx Tx) (*sql.Stmt, error) {
	if tx == nil {
		return s.s, nil
	}
	t, ok := tx.DBTX().(interface {
		StmtContext(ctx context.Context, s *sql.Stmt) *sql.Stmt
	})
	if !ok {
		return nil, fmt.Errorf("the transaction is a %T, which cannot run prepared statements: %w", tx.DBTX(), contend.ErrInvalid)
	}
	return t.StmtContext(ctx, s.s), nil
}

func (s stdStmt) Exec(ctx context.Context, tx Tx, args ...any) (int64, error) {
	st, err := s.in(ctx, tx)
	if err != nil {
		return 0, err
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s stdStmt) QueryRow(ctx context.Context, tx Tx, args ...any) Row {
	st, err := s.in(ctx, tx)
	if err != nil {
		return errRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

func (s stdStmt) Close() error { return s.s.Close() }

// errRow is a Row whose Scan reports err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

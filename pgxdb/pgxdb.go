// Package pgxdb lets the SQL strategies (atomic, pessimistic, optimistic)
// run on pgx's native interface: a *pgxpool.Pool or a pgx.Tx
// of the caller's. Wrap a handle once and pass it where a strategy takes a
// [contend.DB]:
//
//	pool, err := pgxpool.New(ctx, dsn)
//	...
//	db := pgxdb.Wrap(pool)
//	l, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "products"})
//	...
//	err = l.Do(ctx, "sku-1", func(ctx context.Context) error {
//		_, err := pgxdb.Querier(ctx, pool).Exec(ctx, `UPDATE products SET stock = stock - 1 WHERE id = $1`, "sku-1")
//		return err
//	})
//
// The strategies run the same statements, with the same guarantees, as on
// database/sql; a guard's fn reaches the guard's pgx.Tx with [Querier], the
// twin of [contend.Querier]. This is the only package of the module that
// imports pgx, so a program that uses database/sql alone links none of it,
// and a program that uses pgx links no lib/pq.
package pgxdb

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
)

// Handle is what [*pgxpool.Pool], [*pgxpool.Conn], [*pgx.Conn] and [pgx.Tx]
// have in common: statements and a way to begin a transaction (a pgx.Tx
// begins a savepoint).
type Handle interface {
	// Begin starts a transaction, or a savepoint in a pgx.Tx.
	Begin(ctx context.Context) (pgx.Tx, error)
	// Exec runs a statement that returns no rows.
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	// Query runs a query that returns rows.
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	// QueryRow runs a query that returns at most one row.
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// beginner is a pgx handle that begins transactions with options: a pool,
// one of its connections, or a connection.
type beginner interface {
	Handle
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Wrap returns h as a [contend.DB] that the SQL strategies' constructors and
// functions take. A [pgx.Tx] is a transaction the caller owns, in which the
// guards run and never commit, as in a *sql.Tx; a *pgxpool.Pool (or
// anything else with BeginTx(ctx, pgx.TxOptions)) is a pool on which they
// begin a transaction per call. A *pgx.Conn or *pgxpool.Conn is one server
// session: atomic.Update, UpdateN and UpdateReturning run their single
// statement on it, but the guards (and atomic.UpdateSelect) refuse it with an error matching [contend.ErrInvalid], since two
// calls would begin their transactions on one session; pass the pool.
// Whatever else h is, and a nil h, the value returned is refused by the
// strategies with an error matching [contend.ErrInvalid]. Wrap does no I/O
// and never closes h.
func Wrap(h Handle) contend.DB {
	if sqldb.IsNil(h) {
		return invalid{fmt.Errorf("pgxdb: nil handle: %w", contend.ErrInvalid)}
	}
	switch v := h.(type) {
	case pgx.Tx:
		return &db{h: v, tx: &tx{h: v}}
	case beginner:
		d := &db{h: v, begin: v}
		switch v := v.(type) {
		case *pgxpool.Pool:
			d.pool, d.origin = v, v
		case *pgx.Conn, *pgxpool.Conn:
			d.session = true
		}
		return d
	}
	return invalid{fmt.Errorf("pgxdb: a %T is neither a pool (BeginTx) nor a pgx.Tx: %w", h, contend.ErrInvalid)}
}

// Querier returns the pgx.Tx of the guard that runs the calling fn, or h
// when ctx carries none: the pgx twin of [contend.Querier]. Writing fn
// against it lets one fn body work under every guard.
func Querier(ctx context.Context, h Handle) Handle {
	switch v := sqldb.TxFrom(ctx).(type) {
	case *tx:
		return v.h
	case pgx.Tx:
		return v
	}
	return h
}

// WithQuerier returns a context that carries tx as the transaction a
// guard's call joins and [Querier] returns: the pgx twin of
// [contend.WithQuerier]. Guards put their own transactions in ctx this
// way; application code needs it only to make a transaction of its own,
// begun on the pool, one that guards on the pool join.
func WithQuerier(ctx context.Context, tx pgx.Tx) context.Context {
	return sqldb.WithTx(ctx, tx)
}

// invalid is what Wrap returns for a handle it does not know.
type invalid struct{ err error }

func (i invalid) ContendDB() (sqldb.DB, error) { return nil, i.err }

// db is a wrapped handle: a pool when tx is nil.
type db struct {
	h     Handle
	begin beginner      // nil for a pgx.Tx
	tx    *tx           // nil for a pool
	pool  *pgxpool.Pool // nil unless h is one: Acquire takes a connection of it
	conn  *pgxpool.Conn // a connection Acquire took, to give back; nil otherwise
	// origin is the pool h is, or is a connection of: what tells two
	// databases apart. nil when h does not say (a connection, a wrapper of
	// the caller's).
	origin *pgxpool.Pool
	// session: h is one connection, one server session (see sqldb.Open).
	session bool
}

func (d *db) OneSession() bool { return d.session }

// Release gives back a connection [db.Acquire] took.
func (d *db) Release() {
	if d.conn != nil {
		d.conn.Release()
	}
}

func (d *db) ContendDB() (sqldb.DB, error) { return d, nil }

func (d *db) Dialect() sqldb.Dialect { return sqldb.Postgres }

// StatementsEndWithCtx reports true (see [sqldb.EndsWithCtx]): pgx's
// default context watcher puts a deadline on the connection when ctx ends,
// and a configured one that first asks the server to cancel still sets one
// after its delay.
func (d *db) StatementsEndWithCtx() bool { return true }

// TxEndsWithCtx reports true (see [sqldb.TxEndsWithCtx]): pgx commits and
// rolls back under a ctx, watched as any statement's.
func (d *db) TxEndsWithCtx() bool { return true }

func (d *db) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := d.h.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (d *db) QueryRow(ctx context.Context, query string, args ...any) sqldb.Row {
	return d.h.QueryRow(ctx, query, args...)
}

func (d *db) Query(ctx context.Context, query string, args ...any) (sqldb.Rows, error) {
	return queryRows(ctx, d.h, query, args)
}

func (d *db) Tx() sqldb.Tx {
	if d.tx == nil {
		return nil
	}
	return d.tx
}

func (d *db) Outer(ctx context.Context) (sqldb.Tx, error) {
	switch v := sqldb.TxFrom(ctx).(type) {
	case nil:
	case *tx:
		if d.origin != nil && v.origin != nil && d.origin != v.origin {
			return nil, fmt.Errorf("pgxdb: ctx carries a transaction of another pool than this handle's: a guard cannot "+
				"join it, and running beside it could wait for a lock the caller holds: %w", contend.ErrInvalid)
		}
		return v, nil
	case pgx.Tx:
		return &tx{h: v}, nil
	default:
		return nil, fmt.Errorf("ctx carries a %T as its transaction: %w", v, contend.ErrInvalid)
	}
	if q := contend.Querier(ctx, nil); q != nil {
		if _, pool := q.(interface {
			BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
		}); !pool {
			return nil, sqldb.ErrOtherDriver("pgx", "database/sql")
		}
	}
	return nil, nil
}

func (d *db) Begin(ctx context.Context, opts *sql.TxOptions) (sqldb.OwnTx, error) {
	if d.begin == nil {
		return nil, fmt.Errorf("pgxdb: begin on a transaction: %w", contend.ErrInvalid)
	}
	var o pgx.TxOptions
	if opts != nil {
		o.IsoLevel = isoLevel(opts.Isolation)
		if opts.ReadOnly {
			o.AccessMode = pgx.ReadOnly
		}
	}
	t, err := d.begin.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return &tx{h: t, origin: d.origin}, nil
}

func (d *db) Acquire(ctx context.Context) (sqldb.Conn, error) {
	if d.pool == nil {
		return d, nil // one connection already, or a transaction: Release does nothing
	}
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &db{h: c, begin: c, conn: c, origin: d.origin}, nil
}

// Prepare keeps the text only: pgx prepares and caches each statement per
// connection by itself (QueryExecModeCacheStatement, its default).
func (d *db) Prepare(_ context.Context, query string) (sqldb.Stmt, error) {
	return stmt{d: d, query: query}, nil
}

func isoLevel(l sql.IsolationLevel) pgx.TxIsoLevel {
	switch l {
	case sql.LevelReadUncommitted:
		return pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		return pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		return pgx.RepeatableRead
	case sql.LevelSerializable, sql.LevelLinearizable:
		return pgx.Serializable
	}
	return ""
}

// tx is a pgx transaction: the caller's, or one a guard began, which fn's
// ctx carries, so that a nested guard knows which pool it was begun on.
type tx struct {
	h      pgx.Tx
	origin *pgxpool.Pool // nil for a caller's
}

func (t *tx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := t.h.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (t *tx) QueryRow(ctx context.Context, query string, args ...any) sqldb.Row {
	return t.h.QueryRow(ctx, query, args...)
}

func (t *tx) Query(ctx context.Context, query string, args ...any) (sqldb.Rows, error) {
	return queryRows(ctx, t.h, query, args)
}

func (t *tx) Context(ctx context.Context) context.Context { return sqldb.WithTx(ctx, t) }
func (t *tx) DBTX() contend.DBTX                          { return nil }

// Err is always nil: PostgreSQL aborts a transaction on any error, refuses
// every later statement in it until a rollback (to a savepoint, which may
// revive it), and answers its COMMIT with a rollback, which pgx reports as
// an error.
func (t *tx) Err() error                         { return nil }
func (t *tx) Commit(ctx context.Context) error   { return t.h.Commit(ctx) }
func (t *tx) Rollback(ctx context.Context) error { return t.h.Rollback(ctx) }

func queryRows(ctx context.Context, h Handle, query string, args []any) (sqldb.Rows, error) {
	r, err := h.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

type rows struct{ pgx.Rows }

func (r rows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

type stmt struct {
	d     *db
	query string
}

// StatementsEndWithCtx reports true, as [db.StatementsEndWithCtx] does.
func (stmt) StatementsEndWithCtx() bool { return true }

func (s stmt) on(tx sqldb.Tx) sqldb.Querier {
	if tx == nil {
		return s.d
	}
	return tx
}

func (s stmt) Exec(ctx context.Context, tx sqldb.Tx, args ...any) (int64, error) {
	return s.on(tx).Exec(ctx, s.query, args...)
}

func (s stmt) QueryRow(ctx context.Context, tx sqldb.Tx, args ...any) sqldb.Row {
	return s.on(tx).QueryRow(ctx, s.query, args...)
}

func (stmt) Close() error { return nil }

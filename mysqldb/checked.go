package mysqldb

import (
	"context"
	"database/sql"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
)

// checked is a wrapped handle, classified, whose every call that needs the
// server passes the clientFoundRows check first: once it has passed, at the
// cost of one atomic load.
type checked struct {
	sqldb.DB
	h contend.DBTX
	c *check
}

func (d *checked) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return 0, err
	}
	return d.DB.Exec(ctx, query, args...)
}

func (d *checked) QueryRow(ctx context.Context, query string, args ...any) sqldb.Row {
	if err := d.c.pass(ctx, d.h); err != nil {
		return errRow{err}
	}
	return d.DB.QueryRow(ctx, query, args...)
}

func (d *checked) Query(ctx context.Context, query string, args ...any) (sqldb.Rows, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return nil, err
	}
	return d.DB.Query(ctx, query, args...)
}

// Outer checks too, so that a guard whose statements all run in the
// transaction ctx carries is checked all the same.
func (d *checked) Outer(ctx context.Context) (sqldb.Tx, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return nil, err
	}
	return d.DB.Outer(ctx)
}

func (d *checked) Begin(ctx context.Context, opts *sql.TxOptions) (sqldb.OwnTx, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return nil, err
	}
	return d.DB.Begin(ctx, opts)
}

func (d *checked) Acquire(ctx context.Context) (sqldb.Conn, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return nil, err
	}
	return d.DB.Acquire(ctx)
}

func (d *checked) Prepare(ctx context.Context, query string) (sqldb.Stmt, error) {
	if err := d.c.pass(ctx, d.h); err != nil {
		return nil, err
	}
	return d.DB.Prepare(ctx, query)
}

// Tx is the caller's transaction that the handle is, checked as the handle.
func (d *checked) Tx() sqldb.Tx {
	tx := d.DB.Tx()
	if tx == nil {
		return nil
	}
	return checkedTx{tx, d}
}

func (d *checked) Unwrap() sqldb.DB           { return d.DB }
func (d *checked) StatementsEndWithCtx() bool { return sqldb.EndsWithCtx(d.DB) }
func (d *checked) TxEndsWithCtx() bool        { return sqldb.TxEndsWithCtx(d.DB) }

// checkedTx is the caller's transaction of a checked handle.
type checkedTx struct {
	sqldb.Tx
	d *checked
}

// Unwrap lets package sqldb find its own transaction behind the check: to
// end it when the server rolled it back, and to run statements in it.
func (t checkedTx) Unwrap() sqldb.Tx { return t.Tx }

func (t checkedTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if err := t.d.c.pass(ctx, t.d.h); err != nil {
		return 0, err
	}
	return t.Tx.Exec(ctx, query, args...)
}

func (t checkedTx) QueryRow(ctx context.Context, query string, args ...any) sqldb.Row {
	if err := t.d.c.pass(ctx, t.d.h); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, query, args...)
}

func (t checkedTx) Query(ctx context.Context, query string, args ...any) (sqldb.Rows, error) {
	if err := t.d.c.pass(ctx, t.d.h); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, query, args...)
}

func (t checkedTx) StatementsEndWithCtx() bool { return sqldb.EndsWithCtx(t.Tx) }

// errRow is a Row whose Scan reports err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

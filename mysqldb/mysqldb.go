// Package mysqldb lets the SQL strategies run on MySQL and MariaDB through
// go-sql-driver/mysql. Open the pool as usual with clientFoundRows=true in
// the DSN (or with [Open], which sets it), wrap it, and pass the wrapped
// value where a strategy takes a [contend.DB]:
//
//	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/shop?clientFoundRows=true")
//	...
//	h := mysqldb.Wrap(db) // no I/O: the first call that needs the server checks the DSN
//	applied, err := atomic.Update(ctx, h,
//		"UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1", "sku-1")
//
// Wrapping states the dialect once, at construction: the strategies then
// quote names with backquotes, bind with ?, and run MySQL's statements. A
// guard's fn reaches the guard's transaction with [contend.Querier] on the
// *sql.DB, as on PostgreSQL. A *sql.DB or *sql.Conn of this driver passed
// without Wrap is refused with an error matching [contend.ErrInvalid] that
// says to wrap it (a *sql.Tx does not say its driver: unwrapped, it fails at
// its first statement).
//
// # Affected rows
//
// By default the driver reports the rows an UPDATE changed, not the rows it
// matched: an update that writes what a row already holds reports 0, and an
// affected-row check (atomic.Update) would take a win for a lost race.
// The strategies need rows matched, which the driver reports with
// clientFoundRows=true. The first call on a wrapped handle that needs the
// server checks it (three statements on a temporary table of the session's
// own, under that call's ctx, and 5s at most) and refuses a handle without
// it with an error matching [contend.ErrInvalid]. A pool ([*sql.DB], sqlx's
// DB) is checked once, however many times it is wrapped; a connection or a
// transaction once per value Wrap returned. Calls that need the check while
// another call makes it wait for it, each no longer than its own ctx. A
// check that failed (a network error, a ctx that ended) is not remembered:
// the next call checks again.
//
// # What runs, and what differs from PostgreSQL
//
// Package atomic (Update, UpdateN, UpdateSelect, the Claimer),
// pessimistic's row Locker and Advisory guard, package optimistic (Store,
// Guard) and package adaptive run on a wrapped handle.
//
//   - MySQL has no UPDATE ... RETURNING (MariaDB has RETURNING for INSERT and
//     DELETE only): use atomic.UpdateSelect, which reads the row back in
//     the update's transaction.
//   - InnoDB's default isolation, REPEATABLE READ, reads from the snapshot of
//     a transaction's first read: the Locker and the optimistic and
//     adaptive guards begin their transactions at READ COMMITTED, so that
//     fn's plain reads see the latest commit of the rows it locked, nested
//     locks included. Row locks are FOR UPDATE only.
//   - Lock timeouts count whole seconds (innodb_lock_wait_timeout, set
//     around the lock statement only and put back after it).
//   - Advisory locks are GET_LOCK's, which belong to a session, not to a
//     transaction: the Advisory guard holds a connection of the pool per
//     call, so it takes a pool, not a transaction (package pessimistic says
//     why).
//   - A claim's lease column is a DATETIME(6) holding UTC, compared with
//     the server's UTC_TIMESTAMP(6), so sessions' time zones do not matter.
//   - Deadlocks (1213), lock wait timeouts (1205, also MariaDB's NOWAIT),
//     MySQL's NOWAIT (3572) and statement timeouts (1969, 3024) are
//     classified as their PostgreSQL twins. Optimistic's Store and Guard
//     also run an attempt that hit a lock wait timeout again.
//
// Tested on MariaDB 10.11; MySQL 8 by design (the statements are common to
// both), not by test. This is the only package of the module that imports
// go-sql-driver/mysql, so a PostgreSQL program links none of it.
package mysqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/firstuse"
	"github.com/contend/contend/internal/sqldb"
)

// ErrAffectedRows is the error of a wrapped handle whose driver reports rows
// changed rather than rows matched; it matches [contend.ErrInvalid] too.
var ErrAffectedRows = fmt.Errorf("mysqldb: the DSN must set clientFoundRows=true, or UPDATEs that write what "+
	"a row already holds report 0 rows and a won race reads as lost: %w", contend.ErrInvalid)

// checkTimeout bounds the check of clientFoundRows, whatever the ctx of the
// call that makes it.
const checkTimeout = 5 * time.Second

// Wrap returns h, a handle of go-sql-driver/mysql, as a [contend.DB] that
// the SQL strategies' constructors and functions take: a [*sql.DB] or
// sqlx's DB (a pool, on which they begin a transaction per call), or a
// [*sql.Tx] or sqlx's Tx of the caller's (in which they run and never
// commit). A [*sql.Conn] serves atomic.Update's single statements; the
// guards refuse it, as on PostgreSQL: it is one server session. A nil h, a pool of another driver, and a handle
// whose DSN lacks clientFoundRows=true are refused by the strategies with
// an error matching [contend.ErrInvalid]. Wrap does no I/O and never closes
// h, nor do the strategies' constructors that take its value: the first
// call that needs the server checks clientFoundRows (see the package doc).
// The value is safe for simultaneous use by multiple goroutines.
func Wrap(h contend.DBTX) contend.DB {
	if sqldb.IsNil(h) {
		return invalid{fmt.Errorf("mysqldb: nil handle: %w", contend.ErrInvalid)}
	}
	if isMySQL, known := sqldb.DriverIsMySQL(h); known && !isMySQL {
		return invalid{fmt.Errorf("mysqldb: a %T of another driver than go-sql-driver/mysql: %w", h, contend.ErrInvalid)}
	}
	// Classified once: a handle stays what it is.
	std, err := sqldb.OpenStd(h, sqldb.MySQL)
	if err != nil {
		return invalid{err}
	}
	return &db{std: &checked{DB: std, h: h, c: checkOf(h)}}
}

// invalid is what Wrap returns for a handle it cannot use.
type invalid struct{ err error }

func (i invalid) ContendDB() (sqldb.DB, error) { return nil, i.err }

type db struct{ std *checked }

// ContendDB returns the classified handle, which checks clientFoundRows at
// its first call that needs the server.
func (d *db) ContendDB() (sqldb.DB, error) { return d.std, nil }

// checks holds the clientFoundRows check of every pool wrapped, so that a
// pool wrapped many times is checked once. Its keys are weak: a pool the
// program let go of is not kept alive by its check, and its entry goes with
// it.
var checks sync.Map // weak.Pointer[sql.DB] → *check

// checkOf returns the check of h: its pool's when it is one, else a check
// of its own.
func checkOf(h contend.DBTX) *check {
	var p *sql.DB
	switch h := h.(type) {
	case *sql.DB:
		p = h
	case *sqlx.DB:
		p = h.DB
	}
	if p == nil {
		return new(check)
	}
	k := weak.Make(p)
	if c, ok := checks.Load(k); ok {
		return c.(*check)
	}
	c, loaded := checks.LoadOrStore(k, new(check))
	if !loaded {
		runtime.AddCleanup(p, func(k weak.Pointer[sql.DB]) { checks.Delete(k) }, k)
	}
	return c.(*check)
}

// check is the clientFoundRows check of one pool or handle, made at the
// first call that needs it (see firstuse.Step): a check that failed for a
// reason that says nothing of the DSN (the first call's ctx ended, the
// network failed) is made again by the next call.
type check struct{ step firstuse.Step }

// pass returns nil once the check passed, making it or waiting for it
// first when it has not.
func (c *check) pass(ctx context.Context, h contend.DBTX) error {
	if c.step.Passed() {
		return nil
	}
	return c.step.Pass(ctx, "mysqldb: check clientFoundRows", func(ctx context.Context) error {
		return measure(ctx, h)
	}, isAffectedRows)
}

func isAffectedRows(err error) bool { return errors.Is(err, ErrAffectedRows) }

// measure checks clientFoundRows on h, within ctx and checkTimeout: a call
// whose ctx has no deadline must not leave a check hanging on a silent
// network, for every later call to wait behind.
func measure(ctx context.Context, h contend.DBTX) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	found, err := foundRows(ctx, h)
	if err != nil {
		return fmt.Errorf("mysqldb: check clientFoundRows: %w", err)
	}
	if !found {
		return ErrAffectedRows
	}
	return nil
}

// probeTable is the temporary table of the check: the session's own, so
// nothing another session sees.
const probeTable = "contend_found_rows_probe"

// foundRows reports whether an UPDATE that matches a row and changes nothing
// reports it: whether the connection asked for rows matched. The server
// keeps no variable that says so, and the driver's config is not reachable
// from a *sql.DB, so it is measured, on one connection: a temporary table
// lives in its session.
func foundRows(ctx context.Context, h contend.DBTX) (found bool, err error) {
	if p, ok := h.(interface {
		Conn(context.Context) (*sql.Conn, error)
	}); ok {
		c, err := p.Conn(ctx)
		if err != nil {
			return false, err
		}
		defer c.Close()
		h = c
	}
	if _, err := h.ExecContext(ctx, "CREATE TEMPORARY TABLE "+probeTable+" (n int) SELECT 1 AS n"); err != nil {
		return false, err
	}
	defer func() {
		if _, derr := h.ExecContext(ctx, "DROP TEMPORARY TABLE "+probeTable); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	res, err := h.ExecContext(ctx, "UPDATE "+probeTable+" SET n = 1")
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Open opens a pool on cfg with ClientFoundRows set, which the strategies
// need (see the package doc); cfg itself is not changed. Wrap the pool for
// the strategies and keep it for [contend.Querier]. Like sql.Open, it
// connects to nothing yet.
func Open(cfg *mysql.Config) (*sql.DB, error) {
	if cfg == nil {
		return nil, fmt.Errorf("mysqldb: nil config: %w", contend.ErrInvalid)
	}
	c := cfg.Clone()
	c.ClientFoundRows = true
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return nil, fmt.Errorf("mysqldb: %w", err)
	}
	return sql.OpenDB(conn), nil
}

package optimistic

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/sqlident"
	"github.com/contend/contend/internal/txn"
)

// Config names the table and columns a [Store] or a [Guard] works on and
// says how often they retry. Names are validated and quoted at construction;
// keys and values are only ever bind parameters.
type Config struct {
	// Table holds one row per key. It may be schema-qualified
	// ("app.accounts"). Required.
	Table string
	// KeyColumn identifies the row and must be unique: [Store.Insert] relies
	// on a unique index (or primary key) on it alone. Default: "id".
	KeyColumn string
	// VersionColumn is an integer column (bigint is best) that every write
	// through a Store or Guard increments, and that each of them checks
	// against the value it read. It must not be NULL. Default: "version".
	VersionColumn string
	// Retry bounds how often [Store.Update] and [Guard.Do] run again after
	// they lost a race (the version moved between their read and their
	// write, or the server broke a deadlock by failing them, or on MySQL a
	// row lock was not had within innodb_lock_wait_timeout), and how long
	// they wait in between. The zero value is
	// contend.Retry's defaults: 10 attempts, full jitter from 2ms up to
	// 500ms.
	Retry contend.Retry
	// Isolation is the isolation level of the transactions a [Guard]
	// begins; a Store begins none and ignores it. Default: the server's
	// on PostgreSQL; READ COMMITTED on MySQL and MariaDB, where the
	// server's default, REPEATABLE READ, reads from a snapshot taken at an
	// attempt's first read: a row lock taken in fn (package pessimistic's,
	// which joins the guard's transaction) would then let fn read its row
	// as it was at that read, not as last committed, and write back a
	// lost update. The guard's own check holds at either level.
	Isolation sql.IsolationLevel
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction a [Guard] owns. The server's answer is waited for, but a
	// network that went silent would hold Do until the kernel gives up on
	// the connection. When the bound passes, Do returns an error matching
	// [context.DeadlineExceeded] (after a COMMIT the outcome is unknown) and
	// abandons the connection; the server rolls back a transaction whose
	// COMMIT it never got once it notices the session is gone. A Store
	// begins no transactions and ignores it. Default: 5s.
	FinishTimeout time.Duration
	// Observer, when set, hears how every [Store.Update] and [Guard.Do]
	// goes, as events of strategy "optimistic" keyed by the key.
	// Nothing is locked, so nothing is obtained: a call reports
	//   - Retry for each attempt it lost and will make again (Attempts is
	//     that attempt; Err matches [contend.ErrConflict] when the version
	//     moved, or is the deadlock, serialization failure or MySQL's lock
	//     wait timeout);
	//   - Released when it commits (Attempts in all; Hold is the last
	//     attempt, from its read to its commit; Wait the time before it,
	//     earlier attempts and backoff included), or when fn fails (Err is
	//     fn's error; nothing was written);
	//   - GaveUp when the attempts run out or ctx ends (Err is the error
	//     returned);
	//   - Conflict when it ran once in a transaction it does not own and
	//     lost the race (retrying is the owner's part);
	//   - Failed for any other error, a database's or a missing row's.
	// It runs on the caller's goroutine and must not block. Default: nil,
	// no events, at no cost.
	Observer contend.Observer
}

// withDefaults returns c with its zero names set to their defaults.
func (c Config) withDefaults() Config {
	if c.KeyColumn == "" {
		c.KeyColumn = "id"
	}
	if c.VersionColumn == "" {
		c.VersionColumn = "version"
	}
	return c
}

// names is a Config's identifiers, validated and quoted.
type names struct {
	table, key, version string
}

func (c Config) names(d sqldb.Dialect) (names, error) {
	c = c.withDefaults()
	if c.KeyColumn == c.VersionColumn {
		return names{}, fmt.Errorf("optimistic: key and version are both column %q: %w", c.KeyColumn, contend.ErrInvalid)
	}
	var n names
	var err error
	if n.table, err = sqlident.QuoteIn(d, "optimistic: table", c.Table); err != nil {
		return names{}, err
	}
	if n.key, err = sqlident.QuoteIn(d, "optimistic: key column", c.KeyColumn); err != nil {
		return names{}, err
	}
	if n.version, err = sqlident.QuoteIn(d, "optimistic: version column", c.VersionColumn); err != nil {
		return names{}, err
	}
	return n, nil
}

// errMoved is an attempt's "the version moved under me": the signal to read
// again and retry. It never leaves the package; callers get
// [contend.ErrConflict] once the attempts run out.
var errMoved = errors.New("optimistic: version moved")

// retryable reports whether an attempt that failed with err may succeed
// when made again from its read, where the package owns the attempt (a
// Guard's transaction, a Store's statements on a pool): the version moved,
// the server chose the attempt as a deadlock's victim or failed it for
// serialization, or, on MySQL and MariaDB, one of its statements waited for
// a row lock longer than innodb_lock_wait_timeout (1205, which is also
// MariaDB's NOWAIT). InnoDB rolls back only that statement, and the
// attempt, rolled back whole, may find the row free next time, as a loser
// of the version check may find the version still. PostgreSQL's
// lock_timeout is a limit the caller set, and stays an error.
func retryable(err error) bool {
	return isMoved(err) || serverRetry(err)
}

// serverRetry is [retryable] for the errors of the server's.
func serverRetry(err error) bool {
	if sqlerr.Retryable(err) {
		return true
	}
	n, ok := sqlerr.MySQLNumber(err)
	return ok && n == sqlerr.MySQLLockWaitTimeout
}

// conflictOrGone tells apart the two reasons a version-checked statement
// affects no row: the row has another version now (a lost race) or it no
// longer exists. It runs only after the race is lost, so winners never pay
// for it.
func conflictOrGone(ctx context.Context, q sqldb.Querier, probeSQL, op string, key any, version int64) error {
	var now int64
	switch err := scanRow(ctx, q, probeSQL, []any{key}, &now); {
	case sqldb.NoRows(err):
		return fmt.Errorf("optimistic: %s %v: %w", op, key, contend.ErrNotFound)
	case err != nil:
		return fmt.Errorf("optimistic: %s %v: version %d is stale, and reading the current one failed: %w",
			op, key, version, errors.Join(contend.ErrConflict, err))
	default:
		return fmt.Errorf("optimistic: %s %v: version %d is stale (now %d): %w", op, key, version, now, contend.ErrConflict)
	}
}

func checkKey(op string, key any) error {
	if key == nil {
		return fmt.Errorf("optimistic: %s: nil key: %w", op, contend.ErrInvalid)
	}
	if s, ok := key.(string); ok && s == "" {
		return fmt.Errorf("optimistic: %s: empty key: %w", op, contend.ErrInvalid)
	}
	return nil
}

// scanRow runs a query that returns at most one row and scans it into dest,
// which must not be read when it fails: the statement may be left to finish
// on its own (see txn.Watch).
func scanRow(ctx context.Context, q sqldb.Querier, query string, args []any, dest ...any) error {
	return txn.PreferCtx(ctx, txn.WatchScan(ctx, q, query, args, dest))
}

// execApplied runs a statement and reports whether it affected exactly one
// row.
func execApplied(ctx context.Context, q sqldb.Querier, query string, args ...any) (bool, error) {
	n, err := txn.WatchExec(ctx, q, query, args)
	if err != nil {
		return false, txn.PreferCtx(ctx, err)
	}
	return n == 1, nil
}

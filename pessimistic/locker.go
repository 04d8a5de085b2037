package pessimistic

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/keyline"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
)

// Strength is the row lock a [Locker] takes.
type Strength int

const (
	// ForNoKeyUpdate locks with FOR NO KEY UPDATE, the default: it keeps out
	// every other writer and locker of the row, but not the FOR KEY SHARE
	// lock that inserting a row which references this one by foreign key
	// takes. Under FOR UPDATE, adding an order line waits for whoever holds
	// its order. Right whenever fn leaves the key column alone and does not
	// delete the row.
	ForNoKeyUpdate Strength = iota
	// ForUpdate locks with FOR UPDATE: also keeps out rows that reference
	// this one by foreign key. Use it when fn deletes the row or changes its
	// key.
	ForUpdate
)

// String returns the lock clause as SQL spells it.
func (s Strength) String() string {
	switch s {
	case ForNoKeyUpdate:
		return "FOR NO KEY UPDATE"
	case ForUpdate:
		return "FOR UPDATE"
	}
	return "Strength(" + strconv.Itoa(int(s)) + ")"
}

// LockerConfig says which rows a [Locker] locks and how. Names are
// validated and quoted at construction; keys are only ever bind parameters.
type LockerConfig struct {
	// Table holds one row per key; it may be schema-qualified ("app.stock").
	// Required.
	Table string
	// KeyColumn identifies the row. Keys are sent as text, which the server
	// converts to the column's type, so a non-text key column works when
	// keys are written the way the server prints its values. Default: "id".
	KeyColumn string
	// Strength is the row lock taken. Default: [ForNoKeyUpdate].
	Strength Strength
	// OnHeld says what a lock does when another transaction holds the row.
	// Default: [Wait].
	OnHeld OnHeld
	// LockTimeout, when positive, bounds each wait for a lock (SET LOCAL
	// lock_timeout): a longer wait gives up with an error matching
	// [contend.ErrConflict], which is not ctx's error. PostgreSQL counts it
	// in milliseconds. Default: 0, waits are bounded by ctx alone (and by the
	// server's own lock_timeout, if one is set). In a caller's transaction
	// it covers the lock only, and the caller's lock_timeout is put back
	// after it, also when the lock answers "no" without an error (a row held
	// under SkipLocked, a missing row); a lock the server fails with an
	// error aborts the transaction, and the caller's rollback (of it, or to
	// a savepoint) undoes the setting. On MySQL it is
	// innodb_lock_wait_timeout, which counts whole seconds (rounded up),
	// and covers the lock statement only (see the package doc).
	LockTimeout time.Duration
	// Isolation is the isolation level of the transactions the locker
	// begins. Under REPEATABLE READ or SERIALIZABLE a lock on a row another
	// transaction changed since the snapshot fails with a serialization
	// failure, which the locker retries like a deadlock. Default: the
	// server's, normally READ COMMITTED, under which the lock reads the row
	// as last committed.
	Isolation sql.IsolationLevel
	// Retry bounds the runs of a transaction the locker owns when it fails
	// with a deadlock or a serialization failure. Default: contend.Retry's
	// defaults.
	Retry contend.Retry
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction the locker owns. The server's answer is waited for, so
	// that a call never returns while the server still holds its locks, but
	// a network that went silent would hold the call until the kernel gives
	// up on the connection. When the bound passes, the call returns an error
	// matching [context.DeadlineExceeded] (after a COMMIT the outcome is
	// unknown) and abandons the connection; the server rolls back a
	// transaction whose COMMIT it never got once it notices the session is
	// gone. Default: 5s.
	FinishTimeout time.Duration
	// Observer, when set, hears what the locker's calls do, as events of
	// strategy "pessimistic" keyed by the key (LockMany: the sorted keys
	// joined by commas; Claim: no key):
	//   - Obtained when the lock is had (Wait since the call began,
	//     Attempts the transaction's);
	//   - Released when that transaction ends (Hold since the lock; Err
	//     fn's or the commit's error), or, in a transaction the locker does
	//     not own, when fn returns;
	//   - Conflict when NoWait or SkipLocked finds the key held, or a
	//     deadlock or serialization failure hits a transaction the locker
	//     does not own;
	//   - Retry for a deadlock or serialization failure it runs the
	//     transaction again for;
	//   - GaveUp when the lock timeout passes, ctx ends while the lock is
	//     awaited, or the retries run out;
	//   - Failed for any other error, a missing row included.
	// It runs on the caller's goroutine and must not block. Default: nil,
	// no events, at no cost.
	Observer contend.Observer
	// NoLocalQueue turns off the queue a Locker keeps in front of each
	// row lock. With it on (the default), the calls of [Locker.Do] of one
	// Locker that want the same key queue in this process, in the order
	// they came, holding nothing while they wait;
	// only the first two go on to the server, the one holding the lock and
	// the next, which waits there with a connection so that it gets the
	// lock the moment the holder commits. So a hot key's waiters hold two
	// pooled connections, not the whole pool, and calls on other keys go
	// on. A call whose ctx ends in the queue leaves it at once, with the
	// error a wait for the lock that ctx ended gives. The queue is used in
	// Wait mode without a LockTimeout, on a transaction the locker begins
	// itself: a nested call, which joins the transaction around it, never
	// queues (it may be on a key that very transaction holds).
	//
	// Turn it off when turns on a hot key should go to processes in
	// proportion to their callers: with the queue each process sends at
	// most two calls of a key to the server, so a process with a few
	// callers gets as many turns as one with many. Default: false, on.
	NoLocalQueue bool
	// ClaimWhere, when set, restricts the rows [Locker.Claim] takes, as a SQL
	// condition on Table such as "status = 'pending'". It is pasted into the
	// statement as written, so it must come from the program, never from
	// input. Default: "", every row.
	ClaimWhere string
}

// A Locker runs a function inside a transaction after locking rows of one
// table, so that everything fn reads and writes there happens while no other
// transaction, in any process, holds those rows: "lock first, then decide".
//
// The lock is the database's row lock. It lasts exactly as long as the
// transaction: it is released at commit or rollback, and when the connection
// dies, at once, so a crashed holder never leaves a key locked (and, unlike
// a lease, a slow holder never loses it while still working).
//
// fn gets the transaction and nothing else, as an argument and through
// [contend.Querier]; it must run every statement on it. Under a pgx handle
// (package pgxdb) fn reaches the guard's pgx.Tx with pgxdb.Querier, and the
// database/sql argument is nil. A statement sent
// through the pool instead runs outside the transaction (it commits even if
// the transaction rolls back), and if it touches a row the transaction
// locked it waits for the goroutine's own lock, forever: the server sees two
// unrelated sessions, not a deadlock. Once every pooled connection is held by
// such a transaction, the whole pool stops.
//
// When the locker owns the transaction, fn runs again from the start after a
// deadlock or a serialization failure, up to LockerConfig.Retry: keep side effects
// outside the database out of fn, or make them idempotent. Inside a
// transaction the locker does not own (see [NewLocker]), the error is returned,
// matching [contend.ErrConflict], for the owner to run its transaction again.
//
// A Locker is safe for simultaneous use by multiple goroutines. It holds no
// resources and never closes the db it was given.
type Locker struct {
	r     runner
	table string // as configured, for messages

	lockOne    string // $1 key → 1
	existsOne  string // $1 key → bool
	lockMany   string // $1 keys → key per locked row, in lock order
	existsMany string // $1 keys → count
	claim      string // $1 limit → key per claimed row
	// many returns LockMany's two statements for keys and their arguments,
	// where a list of keys takes a placeholder per key (MySQL); nil where
	// it is one array parameter.
	many func(keys []string) (lock, exists string, args []any)
}

var _ contend.Guard = (*Locker)(nil)

// NewLocker validates cfg and returns a locker on db. db is either a pool (a
// [*sql.DB] or sqlx's DB, or a *pgxpool.Pool wrapped by pgxdb.Wrap), on
// which the locker begins a transaction per call, or a transaction (a
// [*sql.Tx], sqlx's Tx, or a wrapped pgx.Tx) that the caller owns, in which
// the locker neither begins nor commits. Anything else, nil and typed nils
// included, is an error matching [contend.ErrInvalid]; so is a single
// connection ([*sql.Conn], a wrapped *pgx.Conn or *pgxpool.Conn), one
// server session on which two calls would share one transaction: pass the
// pool it came from. NewLocker does no
// I/O, so making a locker per caller transaction costs nothing: a table or
// column that does not exist shows in the first lock's error.
//
// On a pool, a call whose ctx carries a transaction (fn of another SQL guard,
// or of an outer call of this locker) joins that transaction; one a guard
// began on another database is refused with [contend.ErrInvalid].
func NewLocker(db contend.DB, cfg LockerConfig) (*Locker, error) {
	if cfg.KeyColumn == "" {
		cfg.KeyColumn = "id"
	}
	if cfg.Strength != ForNoKeyUpdate && cfg.Strength != ForUpdate {
		return nil, fmt.Errorf("pessimistic: unknown strength %v: %w", cfg.Strength, contend.ErrInvalid)
	}
	if cfg.OnHeld != Wait && cfg.OnHeld != NoWait && cfg.OnHeld != SkipLocked {
		return nil, fmt.Errorf("pessimistic: unknown OnHeld %v: %w", cfg.OnHeld, contend.ErrInvalid)
	}
	r, err := newRunner(db, cfg.OnHeld, cfg.LockTimeout, cfg.FinishTimeout, cfg.Isolation, cfg.Retry, cfg.Observer)
	if err != nil {
		return nil, err
	}
	if !cfg.NoLocalQueue && cfg.OnHeld == Wait && cfg.LockTimeout == 0 {
		r.line = keyline.New(keyline.Depth)
	}
	if r.db.Dialect() == sqldb.MySQL {
		return newMySQLLocker(r, cfg)
	}
	table, err := sqlident.Quote("pessimistic: table", cfg.Table)
	if err != nil {
		return nil, err
	}
	key, err := sqlident.Quote("pessimistic: key column", cfg.KeyColumn)
	if err != nil {
		return nil, err
	}
	lockClause, where := clauses(cfg.Strength.String(), cfg)
	return &Locker{
		r:         r,
		table:     cfg.Table,
		lockOne:   fmt.Sprintf(`SELECT 1 FROM %s WHERE %s = $1 %s`, table, key, lockClause),
		existsOne: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s = $1)`, table, key),
		// The rows are locked in the order the query returns them (the lock
		// is taken above the sort), so every caller locking an overlapping
		// set takes the shared rows in the same order: one waits for the
		// other, and neither can hold a row the other needs first.
		// Keys come back as text, the type they were given in, whatever the
		// column's; $1 is a text-array literal (sqlident.TextArray), which
		// the server reads as an array of the column's type.
		lockMany:   fmt.Sprintf(`SELECT %s::text FROM %s WHERE %s = ANY($1) ORDER BY %s %s`, key, table, key, key, lockClause),
		existsMany: fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s = ANY($1)`, table, key),
		// Claiming always skips held rows, whatever the mode: a worker that
		// waited for another's row would only get it after that worker was
		// done with it.
		claim: fmt.Sprintf(`SELECT %s::text FROM %s WHERE %s ORDER BY %s LIMIT $1 %s SKIP LOCKED`,
			key, table, where, key, cfg.Strength),
	}, nil
}

// Do locks key's row and runs fn in the same transaction, which it commits
// when fn returns nil and rolls back otherwise, also when fn panics (the panic
// is re-raised). fn reaches the transaction with [contend.Querier]
// (pgxdb.Querier under pgx); it must not use the pool (see [Locker]).
//
// Do returns fn's error; an error matching [contend.ErrNotFound], without
// running fn, when key has no row; one matching [contend.ErrConflict] when the
// lock was not had (the row is held under NoWait or SkipLocked, the lock
// timeout passed, or a deadlock or serialization failure outlasted the retries
// or happened in a caller's transaction); an error matching both
// [contend.ErrConflict] and ctx's error when ctx ended while the lock was
// awaited; ctx's error when ctx ended before or after; or the backend's
// error.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if key == "" {
		return fmt.Errorf("pessimistic: lock: empty key: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("pessimistic: lock %q: nil fn: %w", key, contend.ErrInvalid)
	}
	what := func() string { return strconv.Quote(key) }
	return l.r.runOn(ctx, l.r.db, key, what, func() string { return key }, func(ctx context.Context, tx sqldb.Tx) error {
		return l.lockRow(ctx, tx, key)
	}, txFn(fn))
}

// txFn is fn as the runner takes it, with the transaction as an argument,
// which Do's fn reaches through ctx instead.
func txFn(fn func(ctx context.Context) error) func(ctx context.Context, tx contend.DBTX) error {
	return func(ctx context.Context, _ contend.DBTX) error { return fn(ctx) }
}

func (l *Locker) lockRow(ctx context.Context, tx sqldb.Tx, key string) error {
	var err error
	if l.r.db.Dialect() == sqldb.Postgres {
		// PostgreSQL counts a SELECT's rows in its command tag, which Exec
		// reports: no rows to read, as cheap as the lock gets.
		var n int64
		if n, err = tx.Exec(ctx, l.lockOne, key); err == nil && n == 0 {
			err = sql.ErrNoRows
		}
	} else {
		var one int
		err = tx.QueryRow(ctx, l.lockOne, key).Scan(&one)
	}
	if !sqldb.NoRows(err) {
		return err
	}
	if l.r.mode != SkipLocked {
		return fmt.Errorf("no such row in %s: %w", l.table, contend.ErrNotFound)
	}
	// SKIP LOCKED answers a held row and a missing one alike; only this, the
	// loser's path, pays a second query to tell them apart.
	var exists bool
	if err := tx.QueryRow(ctx, l.existsOne, key).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("held by another transaction (SKIP LOCKED): %w", contend.ErrConflict)
	}
	return fmt.Errorf("no such row in %s: %w", l.table, contend.ErrNotFound)
}

// LockMany locks the rows of keys with one statement, in the order of the key
// column, and runs fn in the same transaction, like [Locker.Do], which it
// also hands the transaction, as tx (nil under pgx). Because
// every caller takes rows in that one order, two callers locking the same or
// overlapping sets never deadlock each other, whatever order they list the
// keys in. fn gets the locked keys as the database returns them (duplicates
// removed), in lock order.
//
// In Wait and NoWait mode every row must be had: a key without a row gives an
// error matching [contend.ErrNotFound] that names it, and fn does not run. In
// SkipLocked mode fn runs with the rows that were free, leaving out held and
// missing ones alike; when none was free, LockMany returns an error matching
// [contend.ErrConflict], or [contend.ErrNotFound] if none of the rows exist.
//
// LockMany refuses an empty list and empty keys with [contend.ErrInvalid].
func (l *Locker) LockMany(ctx context.Context, keys []string, fn func(ctx context.Context, tx contend.DBTX, locked []string) error) error {
	if len(keys) == 0 {
		return fmt.Errorf("pessimistic: lock many: no keys: %w", contend.ErrInvalid)
	}
	if slices.Contains(keys, "") {
		return fmt.Errorf("pessimistic: lock many: empty key: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("pessimistic: lock many: nil fn: %w", contend.ErrInvalid)
	}
	want := slices.Compact(slices.Sorted(slices.Values(keys)))
	what := func() string { return describe(want) }
	var locked []string
	lockMany, existsMany, args := l.lockMany, l.existsMany, []any{sqlident.TextArray(want)}
	if l.many != nil {
		lockMany, existsMany, args = l.many(want)
	}
	return l.r.run(ctx, what, func() string { return strings.Join(want, ",") }, func(ctx context.Context, tx sqldb.Tx) (err error) {
		locked, err = queryKeys(ctx, tx, lockMany, args...)
		if err != nil || len(locked) == len(want) {
			return err
		}
		if l.r.mode == SkipLocked {
			if len(locked) > 0 {
				return nil
			}
			var n int
			if err := tx.QueryRow(ctx, existsMany, args...).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("every row held by other transactions (SKIP LOCKED): %w", contend.ErrConflict)
			}
			return fmt.Errorf("no such rows in %s: %w", l.table, contend.ErrNotFound)
		}
		// Keys are compared as text; with a non-text key column this names
		// the keys not printed back as given, at least the missing ones.
		missing := slices.DeleteFunc(slices.Clone(want), func(k string) bool { return slices.Contains(locked, k) })
		return fmt.Errorf("no row in %s for %s: %w", l.table, describe(missing), contend.ErrNotFound)
	}, func(ctx context.Context, tx contend.DBTX) error {
		return fn(ctx, tx, locked)
	})
}

// Claim locks up to n rows of the table that no other transaction holds (SKIP
// LOCKED, whatever the mode), the first in key order that meet
// LockerConfig.ClaimWhere, and runs fn with their keys in the same
// transaction, like [Locker.LockMany]: the work-queue pattern. Workers claiming at once get disjoint
// rows and never wait for each other. A job is done when fn changes its row so
// ClaimWhere no longer holds, or deletes it, in the transaction: if the
// worker dies first, the rollback puts the job back for the next claim.
//
// When no row is free Claim returns an error matching [contend.ErrNotFound]
// (nothing to claim now: the table is empty, or every row is held) without
// running fn. n must be positive.
func (l *Locker) Claim(ctx context.Context, n int, fn func(ctx context.Context, tx contend.DBTX, claimed []string) error) error {
	if n <= 0 {
		return fmt.Errorf("pessimistic: claim: n = %d is not positive: %w", n, contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("pessimistic: claim: nil fn: %w", contend.ErrInvalid)
	}
	what := func() string { return fmt.Sprintf("up to %d free rows of %s", n, l.table) }
	var claimed []string
	return l.r.run(ctx, what, func() string { return "" }, func(ctx context.Context, tx sqldb.Tx) (err error) {
		claimed, err = queryKeys(ctx, tx, l.claim, n)
		if err == nil && len(claimed) == 0 {
			err = fmt.Errorf("no free row: %w", contend.ErrNotFound)
		}
		return err
	}, func(ctx context.Context, tx contend.DBTX) error {
		return fn(ctx, tx, claimed)
	})
}

func queryKeys(ctx context.Context, tx sqldb.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// describe names keys in an error message, the first few of a long list.
func describe(keys []string) string {
	const shown = 5
	quoted := make([]string, 0, min(len(keys), shown))
	for _, k := range keys[:min(len(keys), shown)] {
		quoted = append(quoted, strconv.Quote(k))
	}
	s := strings.Join(quoted, ", ")
	if len(keys) > shown {
		s += fmt.Sprintf(" and %d more", len(keys)-shown)
	}
	return s
}

// clauses returns the lock clause of cfg's mode at strength (FOR UPDATE,
// FOR NO KEY UPDATE, ...), and Claim's filter (ClaimWhere, or "true").
func clauses(strength string, cfg LockerConfig) (lock, where string) {
	lock = strength
	switch cfg.OnHeld {
	case NoWait:
		lock += " NOWAIT"
	case SkipLocked:
		lock += " SKIP LOCKED"
	}
	where = "true"
	if c := strings.TrimSpace(cfg.ClaimWhere); c != "" {
		where = "(" + c + ")"
	}
	return lock, where
}

package optimistic

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
)

// A Store reads and writes rows of one table as values of the struct type T,
// checking a version column on every write, so that a write based on a stale
// read fails instead of overwriting what another writer did in between (the
// lost update). Nothing is locked: readers never wait, and of two writers
// that read the same version, the database lets the first through and the
// second affects no row and is told so.
//
// T's columns come from its `db` struct tags, mapped as sqlx maps them (the
// db's own mapper when db is an sqlx handle; untagged fields map to their
// lower-cased names, `db:"-"` skips a field). T must have a field for the key
// column and an integer field for the version column.
//
// Keys are strings, as in every guard of this module: [Store.Get] and
// [Store.Update] send the key as text, and the server converts it to the
// key column's type, so a bigint key column takes "42". T's key field may
// be of the column's own type (an int64 for a bigint); [Store.Save],
// [Store.Touch] and [Store.Delete] send its value.
//
// The method family:
//   - [Store.Update] is the one most callers want: read, let fn change the
//     value, write if the version is unchanged, else read again and retry
//     under [Config.Retry].
//   - [Store.Save] and [Store.Delete] are compare-and-set on a value the
//     caller read earlier, for flows where the read and the write are
//     different requests (the version travels to the client and back). They
//     never retry: the caller must look at the new state first.
//   - [Store.Touch] bumps the version of a row read but not changed, so a
//     decision based on it fails if the row moved meanwhile.
//   - [Store.Get] and [Store.Insert] read and create rows.
//
// After a successful write the caller's value carries the new version, so it
// can be written again without conflicting with itself. Version 0 is an
// ordinary version: it is checked like any other.
//
// Every method runs its statements in the transaction ctx carries, when it
// carries one (a guard's fn, or a context made with [contend.WithQuerier] or
// pgxdb.WithQuerier), and commits or rolls back with it; else on db.
//
// A Store is safe for simultaneous use by multiple goroutines. It never closes
// the db it was given.
type Store[T any] struct {
	db       sqldb.DB
	m        *mapping
	retry    contend.Retry
	observer contend.Observer // nil: report nothing

	// The statements' parameters, in the order they take their arguments
	// (MySQL binds its placeholders in the order they appear).
	selectSQL string // key → every column
	probeSQL  string // key → version
	insertSQL string // every column, in order
	existsSQL string // key → a row if it exists, read under a lock; MySQL only
	updateSQL string // the set columns, key, version
	touchSQL  string // key, version
	deleteSQL string // key, version
}

// NewStore validates cfg and T's mapping and builds the store's statements.
// It fails with an error matching [contend.ErrInvalid] when db is nil,
// neither a pool nor a transaction, or a single connection (see
// [NewGuard]), T is not a struct, T lacks a field for the key or version column, the version
// field is not an integer, or a name is not a plain identifier. It sends
// nothing to the database: a table or column that does not exist shows at the
// first call.
func NewStore[T any](db contend.DB, cfg Config) (*Store[T], error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return nil, fmt.Errorf("optimistic: %w", err)
	}
	dialect := d.Dialect()
	n, err := cfg.names(dialect)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMapping(reflect.TypeFor[T](), mapperFor(db), dialect, cfg.KeyColumn, cfg.VersionColumn)
	if err != nil {
		return nil, err
	}
	s := &Store[T]{db: d, m: m, retry: cfg.Retry, observer: cfg.Observer}

	all := make([]string, len(m.cols))
	params := make([]string, len(m.cols))
	for i, c := range m.cols {
		all[i] = c.quoted
		params[i] = dialect.Param(i + 1)
	}
	// The version is always part of the SET, and the check is always part of
	// the WHERE: whichever of two writers that read one version gets the
	// row's lock first bumps it, and the other, once the first commits,
	// re-evaluates "version = $2" against the committed row and matches
	// nothing. A zero version is checked too: skipping the check for it (as
	// GORM's plugin does for a zero value) lets a fresh, never-read value
	// overwrite anything.
	//
	// On MySQL too: there an UPDATE reads the latest committed row, not the
	// snapshot of a REPEATABLE READ transaction, after waiting for the row
	// lock. The version is set last, as MySQL assigns left to right and
	// later assignments see earlier ones; no set column reads it anyway.
	sets := make([]string, 0, len(m.set)+1)
	for i, c := range m.set {
		sets = append(sets, fmt.Sprintf("%s = %s", m.cols[c].quoted, dialect.Param(i+1)))
	}
	sets = append(sets, fmt.Sprintf("%s = %s + 1", n.version, n.version))
	setWhere := fmt.Sprintf("%s = %s AND %s = %s", n.key, dialect.Param(len(m.set)+1), n.version, dialect.Param(len(m.set)+2))
	where := fmt.Sprintf("%s = %s AND %s = %s", n.key, dialect.Param(1), n.version, dialect.Param(2))

	s.selectSQL = fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", strings.Join(all, ", "), n.table, n.key, dialect.Param(1))
	s.probeSQL = fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", n.version, n.table, n.key, dialect.Param(1))
	s.insertSQL = fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", n.table, strings.Join(all, ", "), strings.Join(params, ", "))
	if dialect == sqldb.MySQL {
		// A duplicate key fails the statement only, not the transaction
		// it runs in, so Insert catches it (1062) and asks whether the
		// key's row is what it ran into: a unique index on another column
		// may be. Not ON DUPLICATE KEY UPDATE: with clientFoundRows, which
		// the strategies need, a duplicate that changes nothing counts 1
		// row, as an insert does. Not INSERT IGNORE: it turns other
		// errors (a NULL into NOT NULL, a value too long) into warnings.
		// The read locks, so that it sees the row the insert ran into
		// even from an older REPEATABLE READ snapshot; the insert holds
		// that lock already.
		s.existsSQL = fmt.Sprintf("SELECT 1 FROM %s WHERE %s = ? LOCK IN SHARE MODE", n.table, n.key)
	} else {
		// ON CONFLICT rather than catching 23505: a unique violation
		// aborts the transaction it happens in, and Insert may run inside
		// a guard's.
		s.insertSQL += fmt.Sprintf(" ON CONFLICT (%s) DO NOTHING", n.key)
	}
	s.updateSQL = fmt.Sprintf("UPDATE %s SET %s WHERE %s", n.table, strings.Join(sets, ", "), setWhere)
	s.touchSQL = fmt.Sprintf("UPDATE %s SET %s = %s + 1 WHERE %s", n.table, n.version, n.version, where)
	s.deleteSQL = fmt.Sprintf("DELETE FROM %s WHERE %s", n.table, where)
	return s, nil
}

// Get reads key's row. It returns an error matching [contend.ErrNotFound]
// when there is none.
func (s *Store[T]) Get(ctx context.Context, key string) (T, error) {
	var v T
	if err := checkKey("get", key); err != nil {
		return v, err
	}
	q, err := s.querier(ctx)
	if err == nil {
		err = s.get(ctx, q, key, &v)
	}
	if err != nil {
		return v, fmt.Errorf("optimistic: get %v: %w", key, err)
	}
	return v, nil
}

// querier returns where a statement outside Update's retries runs: in the
// transaction ctx carries, or on db.
func (s *Store[T]) querier(ctx context.Context) (sqldb.Querier, error) {
	h, err := txn.Resolve(ctx, s.db)
	if err != nil {
		return nil, err
	}
	if !h.Owned() {
		return h.Tx, nil
	}
	return s.db, nil
}

func (s *Store[T]) get(ctx context.Context, q sqldb.Querier, key any, v *T) error {
	err := scanRow(ctx, q, s.selectSQL, []any{key}, s.m.dests(reflect.ValueOf(v).Elem())...)
	if sqldb.NoRows(err) {
		return contend.ErrNotFound
	}
	return err
}

// Insert creates v's row, with v's version as it is (usually 0). It returns an
// error matching [contend.ErrConflict] when a row with v's key exists already,
// whatever its content: insert-if-absent, so of concurrent inserts of one key
// exactly one succeeds.
func (s *Store[T]) Insert(ctx context.Context, v *T) error {
	rv, key, err := s.value("insert", v)
	if err != nil {
		return err
	}
	q, err := s.querier(ctx)
	if err != nil {
		return fmt.Errorf("optimistic: insert %v: %w", key, err)
	}
	applied, err := execApplied(ctx, q, s.insertSQL, s.m.values(rv)...)
	if err != nil && s.existsSQL != "" && sqlerr.Is(err, sqlerr.UniqueViolation) {
		var one int
		switch perr := scanRow(ctx, q, s.existsSQL, []any{key}, &one); {
		case perr == nil:
			applied, err = false, nil
		case !sqldb.NoRows(perr):
			err = errors.Join(err, perr)
		}
	}
	if err != nil {
		return fmt.Errorf("optimistic: insert %v: %w", key, err)
	}
	if !applied {
		return fmt.Errorf("optimistic: insert %v: key exists: %w", key, contend.ErrConflict)
	}
	return nil
}

// Update reads key's row, passes it to fn to change, and writes every column
// back if the row's version is still the one read, bumping it. When the
// version moved in between (or the write was a deadlock's victim, or on
// MySQL waited for the row's lock too long), it reads the row again and runs
// fn again, under [Config.Retry]; fn may therefore run several times and
// must only change the value it is given. Changes fn makes to the key or version fields are
// ignored. On a pool, each attempt holds one connection from its read to its
// write, fn included: keep fn quick (the longer it runs, the likelier another
// writer gets in first anyway).
//
// Inside a transaction (the Store's db is one, or ctx carries a guard's),
// Update makes one attempt and never retries: a lost race is returned at
// once, for the transaction's owner to run it again from the start.
//
// Update returns the value as written, carrying its new version. It returns
// fn's error unchanged, having written nothing, when fn fails; an error
// matching [contend.ErrNotFound] when there is no row for key (also when it
// was deleted between attempts); an error matching [contend.ErrConflict] when
// every attempt lost the race; and ctx's error when ctx ends first. A panic in
// fn propagates; nothing has been written then either.
func (s *Store[T]) Update(ctx context.Context, key string, fn func(*T) error) (T, error) {
	var out T
	if err := checkKey("update", key); err != nil {
		return out, err
	}
	if fn == nil {
		return out, fmt.Errorf("optimistic: update %v: nil fn: %w", key, contend.ErrInvalid)
	}
	h, err := txn.Resolve(ctx, s.db)
	if err != nil {
		return out, fmt.Errorf("optimistic: update %v: %w", key, err)
	}
	var r *report // nil: no Observer
	if s.observer != nil {
		rep := newReport(s.observer, key, s.retry)
		rep.joined = !h.Owned()
		r = &rep
	}
	var q sqldb.Querier
	retry := s.retry
	if !h.Owned() {
		// Inside a transaction someone else owns a retry cannot succeed
		// where the owner's would not (under REPEATABLE READ it reads the
		// same snapshot again), and its backoff would sleep while holding
		// the owner's locks: the owner runs its transaction again instead.
		q, retry = h.Tx, contend.Retry{MaxAttempts: 1}
	}
	var version int64 // of the last attempt's read
	again := retryable
	if r != nil {
		again = func(err error) bool {
			ok := retryable(err)
			r.failed(ctx, err, ok)
			return ok
		}
	}
	attempts, err := retry.Do(ctx, func(ctx context.Context) (err error) {
		q := q
		if q == nil {
			// One connection for the read and the write: taking one from a
			// busy pool for each would leave the row unwatched while the
			// write waits for a connection, and every writer that commits
			// in that wait turns this attempt into a loss. On a hot row with
			// a busy pool that cut the attempts per success several-fold.
			c, cerr := s.db.Acquire(ctx)
			if cerr != nil {
				return txn.PreferCtx(ctx, cerr)
			}
			defer func() {
				if errors.Is(err, txn.ErrNoAnswer) {
					// A statement still waits on c, and giving it back
					// would wait for it: the pool gets c once it returns.
					go c.Release()
					return
				}
				c.Release()
			}()
			q = c
		}
		if r != nil {
			r.attempt()
		}
		// An attempt allocates twice: a, the value, and args, one slice
		// cut in three for the read's key, its destinations (a.v's fields)
		// and the update's arguments, which would each be an allocation
		// of their own, escaping through the driver's interface. Each
		// attempt has its own: a read given up on (see txn.Watch) may
		// still scan into them.
		a := new(updateAttempt[T])
		rv := reflect.ValueOf(&a.v).Elem()
		args := append(s.m.attemptArgs(), key)
		readArgs, dests := args[:1], s.m.appendDests(args[1:1], rv)
		switch err := scanRow(ctx, q, s.selectSQL, readArgs, dests...); {
		case sqldb.NoRows(err):
			return contend.ErrNotFound
		case err != nil:
			return err
		}
		a.read = a.v
		version = s.m.versionOf(rv)
		if err := fn(&a.v); err != nil {
			if r != nil {
				r.fnErr = err
			}
			return fnError{err}
		}
		update := s.m.appendUpdateArgs(dests[len(dests):], rv, key, version)
		applied, err := execApplied(ctx, q, s.updateSQL, update...)
		if err != nil {
			return err
		}
		if !applied {
			return errMoved
		}
		// The key is not written (it is the WHERE) and the version is the
		// statement's: give back what the row now has, whatever fn did to
		// those fields.
		s.m.field(rv, s.m.key).Set(s.m.field(reflect.ValueOf(&a.read).Elem(), s.m.key))
		s.m.setVersion(rv, version+1)
		out = a.v
		return nil
	}, again)
	var probe sqldb.Querier = s.db
	if q != nil {
		probe = q
	}
	err = s.updateErr(ctx, probe, key, version, err)
	if r != nil {
		r.end(ctx, attempts, err)
	}
	return out, err
}

// An updateAttempt is the value one attempt of [Store.Update] reads into
// and hands fn, beside the row as read, in one allocation.
type updateAttempt[T any] struct {
	v    T // read, then changed by fn
	read T // as read: the key Update gives back is the row's
}

// fnError carries fn's error through the retry loop, marking it as fn's so
// it is returned unchanged and never retried.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// isFnError reports whether err is fn's, as the retry loop returns it:
// itself, never wrapped (fnError has no Unwrap, so that fn's own deadlock
// is not taken for the guard's and retried). A type assertion, not
// errors.As, whose target would be allocated on every call.
func isFnError(err error) bool {
	_, ok := err.(fnError)
	return ok
}

func isMoved(err error) bool { return errors.Is(err, errMoved) }

func (s *Store[T]) updateErr(ctx context.Context, q sqldb.Querier, key any, version int64, err error) error {
	switch {
	case err == nil:
		return nil
	case isFnError(err):
		return err.(fnError).err
	case err == errMoved:
		// Retry.Do returns the last attempt's error itself when the attempts
		// ran out, and wraps it with ctx's error when ctx ended first: only
		// the former is a lost race. A row deleted after the last read
		// matches no row either: tell the two apart, so a vanished row is not
		// reported as a conflict.
		return conflictOrGone(ctx, q, s.probeSQL, "update", key, version)
	case errors.Is(err, contend.ErrNotFound):
		return fmt.Errorf("optimistic: update %v: %w", key, contend.ErrNotFound)
	default:
		return fmt.Errorf("optimistic: update %v: %w", key, err)
	}
}

// Save writes every column of v to its row if the row's version is still
// v's, bumping it, and sets v's version to the new one. It is compare-and-set
// for a value read earlier, possibly in another request: it never retries,
// because only the caller can decide again on the new state. It returns an
// error matching [contend.ErrConflict] when the version moved and
// [contend.ErrNotFound] when the row is gone; v is unchanged then.
//
// Inside a transaction that later rolls back, v's version is ahead of the
// row's: read it again.
func (s *Store[T]) Save(ctx context.Context, v *T) error {
	return s.compareAndSet(ctx, "save", v, func(rv reflect.Value, key any, version int64) (string, []any) {
		return s.updateSQL, s.m.updateArgs(rv, key, version)
	}, true)
}

// Touch bumps the version of v's row if it is still v's, changing nothing
// else, and sets v's version to the new one: a force-increment. Use it for a
// row a decision was based on but that the decision does not write. Run in
// the same transaction as the decision's writes (a guard's, or any made
// reachable with [contend.WithQuerier]), it makes them commit only if the row
// did not move since it was read, and it makes any concurrent decision based
// on the same version fail. It returns errors like [Store.Save].
func (s *Store[T]) Touch(ctx context.Context, v *T) error {
	return s.compareAndSet(ctx, "touch", v, func(_ reflect.Value, key any, version int64) (string, []any) {
		return s.touchSQL, []any{key, version}
	}, true)
}

// Delete deletes v's row if its version is still v's. It returns errors like
// [Store.Save]: a delete based on a stale read does not remove a row someone
// changed since.
func (s *Store[T]) Delete(ctx context.Context, v *T) error {
	return s.compareAndSet(ctx, "delete", v, func(_ reflect.Value, key any, version int64) (string, []any) {
		return s.deleteSQL, []any{key, version}
	}, false)
}

func (s *Store[T]) compareAndSet(ctx context.Context, op string, v *T,
	stmt func(rv reflect.Value, key any, version int64) (string, []any), bump bool) error {
	rv, key, err := s.value(op, v)
	if err != nil {
		return err
	}
	version := s.m.versionOf(rv)
	q, err := s.querier(ctx)
	if err != nil {
		return fmt.Errorf("optimistic: %s %v: %w", op, key, err)
	}
	query, args := stmt(rv, key, version)
	applied, err := execApplied(ctx, q, query, args...)
	if err != nil {
		return fmt.Errorf("optimistic: %s %v: %w", op, key, err)
	}
	if !applied {
		return conflictOrGone(ctx, q, s.probeSQL, op, key, version)
	}
	if bump {
		s.m.setVersion(rv, version+1)
	}
	return nil
}

// value checks that v is a value with a key and returns its reflection and
// its key.
func (s *Store[T]) value(op string, v *T) (reflect.Value, any, error) {
	if v == nil {
		return reflect.Value{}, nil, fmt.Errorf("optimistic: %s: nil value: %w", op, contend.ErrInvalid)
	}
	rv := reflect.ValueOf(v).Elem()
	key := s.m.keyOf(rv)
	if err := checkKey(op, key); err != nil {
		return reflect.Value{}, nil, err
	}
	return rv, key, nil
}

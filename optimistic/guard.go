package optimistic

import (
	"context"
	"errors"
	"fmt"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// A Guard runs fn for a key inside a transaction that commits only if the
// key's version did not move while fn ran, bumping it; otherwise it rolls fn's
// writes back and runs fn again, in a fresh transaction, under
// [Config.Retry]. The table needs only the key and version columns (the
// guarded state may live in other rows and tables), but every writer of the
// state a key stands for must go through the guard or a [Store] on that
// table, so that each of its writes bumps the version.
//
// The promise: the writes fn makes through the guard's transaction
// ([contend.Querier]) commit only if nothing else committed a write for the
// key since fn's attempt began, so no update is lost, across goroutines and
// processes. Nothing is locked while fn runs, so fns for one key overlap, and
// fn may run more than once per Do: everything fn does outside the
// transaction (a call to another service, an email, a log line, a write on
// another connection) happens once per attempt and is not rolled back. Keep
// such effects out of fn, or make them idempotent.
//
// Do takes no lock before fn: callers of one key do not queue, they race, and
// a lost race costs a retry, with backoff. (Statements still wait for row
// locks, as every write does: a write to a row that another attempt has
// written waits until that transaction ends, and the version check waits for
// an attempt that is committing.) Under heavy contention on one key most
// attempts lose; see the package doc for when to lock instead.
//
// A Guard is safe for simultaneous use by multiple goroutines. It never
// closes the db it was given.
type Guard struct {
	db       sqldb.DB
	opts     txn.Options
	observer contend.Observer // nil: report nothing

	readSQL string // key → version
	bumpSQL string // key, version
}

var _ contend.Guard = (*Guard)(nil)

// NewGuard validates cfg and builds the guard's statements. db is a pool (a
// [*sql.DB], sqlx's DB, anything with BeginTx(ctx, *sql.TxOptions)
// (*sql.Tx, error), a *pgxpool.Pool wrapped by pgxdb.Wrap, or a MySQL pool
// wrapped by mysqldb.Wrap), on which Do
// begins a transaction per attempt, or a transaction the caller owns
// ([*sql.Tx], sqlx's Tx, a wrapped pgx.Tx), in which Do runs fn once and
// leaves retrying to the owner. It fails with an error
// matching [contend.ErrInvalid] when db is nil or of another kind (a wrapper
// with only [contend.DBTX]'s methods could be either), a single connection
// ([*sql.Conn], a wrapped *pgx.Conn or *pgxpool.Conn: one server session,
// on which two calls would share one transaction; pass the pool it came
// from), or when a name is not a plain identifier.
//
// On a pool, a Do whose ctx carries a transaction (fn of another SQL guard)
// joins it, as on a transaction the caller owns; one a guard began on
// another database is refused with [contend.ErrInvalid].
func NewGuard(db contend.DB, cfg Config) (*Guard, error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return nil, fmt.Errorf("optimistic: %w", err)
	}
	if cfg.FinishTimeout < 0 {
		return nil, fmt.Errorf("optimistic: finish timeout %v is negative: %w", cfg.FinishTimeout, contend.ErrInvalid)
	}
	dialect := d.Dialect()
	n, err := cfg.names(dialect)
	if err != nil {
		return nil, err
	}
	p1, p2 := dialect.Param(1), dialect.Param(2)
	return &Guard{
		db:       d,
		opts:     txn.Options{Tx: dialect.GuardTx(cfg.Isolation), Retry: cfg.Retry, Retryable: retryable, FinishTimeout: cfg.FinishTimeout},
		observer: cfg.Observer,
		readSQL:  fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", n.version, n.table, n.key, p1),
		bumpSQL:  fmt.Sprintf("UPDATE %s SET %s = %s + 1 WHERE %s = %s AND %s = %s", n.table, n.version, n.version, n.key, p1, n.version, p2),
	}, nil
}

// Do reads key's version, runs fn in a transaction that fn reaches through
// [contend.Querier], and commits only if the version is still the one read,
// bumping it. When it moved, Do rolls back and runs fn again in a new
// transaction, under [Config.Retry].
//
// Do returns fn's error unchanged (after rolling back); an error matching
// [contend.ErrNotFound] when key has no row; an error matching
// [contend.ErrConflict], naming key, when every attempt lost the race; ctx's
// error when ctx ends first; or the database's error. A panic in fn rolls back
// and propagates. Deadlocks and serialization failures run the transaction
// again too, and so, on MySQL and MariaDB, does a lock wait timeout (1205).
func (g *Guard) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if key == "" {
		return fmt.Errorf("optimistic: do: empty key: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("optimistic: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	var r *report // nil: no Observer
	if g.observer != nil {
		rep := newReport(g.observer, key, g.opts.Retry)
		r = &rep
	}
	attempt := func(ctx context.Context, tx sqldb.Tx) error {
		if r != nil {
			r.attempt()
		}
		c := newVersionCheck(key)
		switch err := scanRow(ctx, tx, g.readSQL, c.readArgs(), c.dest[:]...); {
		case sqldb.NoRows(err):
			return fmt.Errorf("optimistic: do %q: %w", key, contend.ErrNotFound)
		case err != nil:
			return fmt.Errorf("optimistic: do %q: read version: %w", key, err)
		}
		if err := fn(ctx); err != nil {
			if r != nil {
				r.fnErr = err
			}
			return err
		}
		// The check must be the transaction's last statement and must be on
		// the row every writer of key's state bumps. Under READ COMMITTED it
		// catches every writer that committed after the read above, which is
		// all that matters: fn's own reads came after that read, so they saw
		// whatever committed before it. Such a writer either
		//   - committed before this UPDATE started: the UPDATE sees the
		//     bumped version and matches no row;
		//   - still holds the row when this UPDATE reaches it: the UPDATE
		//     waits for its lock, and once the writer commits, PostgreSQL
		//     re-evaluates "version = $2" against the committed row (not the
		//     snapshot), as InnoDB reads the latest committed row for an
		//     UPDATE at every isolation level, and matches no row; if the
		//     writer rolls back, there was nothing to lose;
		//   - reaches the row after this UPDATE: it waits for this
		//     transaction's lock and then finds the version this one bumped,
		//     so it is the one that loses.
		// Either way exactly one of two transactions that read one version
		// commits. fn's writes to the same row (if it has state besides the
		// version) do not hide a conflict: an UPDATE that leaves the version
		// column alone carries the latest committed version forward.
		applied, err := execApplied(ctx, tx, g.bumpSQL, c.bumpArgs()...)
		if err != nil {
			return fmt.Errorf("optimistic: do %q: bump version: %w", key, err)
		}
		if !applied {
			return errMoved
		}
		return nil
	}
	var attempts int
	var err error
	if r == nil {
		attempts, err = txn.RunTx(ctx, g.db, g.opts, attempt)
	} else {
		attempts, err = g.runObserved(ctx, r, attempt)
	}
	if err == errMoved {
		// txn.Run returns the last attempt's error itself when the attempts
		// ran out (and wraps it when ctx ended first). The row may also have
		// been deleted while fn ran; that is not a lost race. Inside a
		// transaction someone else owns, the probe runs there: on the pool
		// it could wait for a row that transaction holds.
		var q sqldb.Querier = g.db
		if h, herr := txn.Resolve(ctx, g.db); herr == nil && !h.Owned() {
			q = h.Tx
		}
		err = g.conflictOrGone(ctx, q, key, attempts)
	}
	if r != nil {
		r.end(ctx, attempts, err)
	}
	return err
}

// A versionCheck holds what an attempt's read of the version and its bump
// hand the driver: the key, the version read, and the slices that carry
// them. Passed through the driver's interface, each slice and the version
// would be an allocation of its own; together they are one, and the key is
// boxed once for both statements. Each attempt has its own: a read given up
// on (see txn.Watch) may still write its version.
type versionCheck struct {
	version int64
	args    [2]any // key, version
	dest    [1]any // &version
}

func newVersionCheck(key string) *versionCheck {
	c := &versionCheck{args: [2]any{key}}
	c.dest[0] = &c.version
	return c
}

// readArgs returns the arguments of the read: the key.
func (c *versionCheck) readArgs() []any { return c.args[:1] }

// bumpArgs returns the arguments of the bump: the key and the version read.
func (c *versionCheck) bumpArgs() []any {
	c.args[1] = c.version
	return c.args[:]
}

func (g *Guard) conflictOrGone(ctx context.Context, q sqldb.Querier, key string, attempts int) error {
	var version int64
	switch err := scanRow(ctx, q, g.readSQL, []any{key}, &version); {
	case sqldb.NoRows(err):
		return fmt.Errorf("optimistic: do %q: %w", key, contend.ErrNotFound)
	case err != nil:
		return fmt.Errorf("optimistic: do %q: version moved on each of %d attempts, and reading it failed: %w",
			key, attempts, errors.Join(contend.ErrConflict, err))
	}
	return fmt.Errorf("optimistic: do %q: version moved on each of %d attempts: %w", key, attempts, contend.ErrConflict)
}

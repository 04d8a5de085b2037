package pessimistic

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
)

// AdvisoryConfig says how an [Advisory] locks.
type AdvisoryConfig struct {
	// OnHeld is [Wait] (pg_advisory_xact_lock) or [NoWait]
	// (pg_try_advisory_xact_lock: a held key gives [contend.ErrConflict] at
	// once, and the transaction stays usable). Default: Wait.
	OnHeld OnHeld
	// LockTimeout, when positive, bounds each wait for a lock, as
	// [LockerConfig.LockTimeout] does. On MySQL it is GET_LOCK's timeout, which
	// counts whole seconds: it is rounded up to the next second. Default:
	// 0, bounded by ctx alone.
	LockTimeout time.Duration
	// Isolation is the isolation level of the transactions the guard
	// begins. Default: the server's; READ COMMITTED on MySQL, as for the
	// [Locker].
	Isolation sql.IsolationLevel
	// Retry bounds the runs of a transaction the guard owns when it fails
	// with a deadlock or a serialization failure. Default: contend.Retry's
	// defaults.
	Retry contend.Retry
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction the guard owns, as [LockerConfig.FinishTimeout] does; on MySQL,
	// for the COMMIT or ROLLBACK and the release of the lock after it, in
	// all. Default: 5s.
	FinishTimeout time.Duration
	// Observer, when set, hears what the guard's calls do, as
	// [LockerConfig.Observer] lists; a key held under NoWait is a Conflict.
	// Default: nil, no events, at no cost.
	Observer contend.Observer
}

// Advisory locks keys that have no row (a report period, an external
// account, a name about to be inserted) with PostgreSQL's transaction-level
// advisory locks, and runs a function in the same transaction. It keeps the
// promises of a [Locker]: exclusive across processes for the life of the
// transaction, released at commit or rollback or when the connection dies,
// fn gets only the transaction, the same retries, the same errors (except
// that no key is ever missing).
//
// The lock is taken on a 64-bit hash of the key computed by the server,
//
//	pg_advisory_xact_lock(hashtextextended(key, 0))
//
// rather than by this package (an FNV-1a in Go, say), so that a program in any
// language that locks the same key with the same expression excludes and is
// excluded by this guard: the one server they all talk to computes the id, so
// they agree by construction, with nothing to port and nothing to get subtly
// wrong (byte order, text encoding). Advisory lock ids form one space per
// database, shared with every other user of advisory locks: prefix keys with
// their kind ("report:2024-06", not "2024-06"). Two keys with the same hash
// serialise each other needlessly, which 64 bits make unlikely; they never
// break exclusion.
//
// Locks are reentrant within a transaction: a nested call for a key the
// transaction already holds goes straight in.
//
// On MySQL and MariaDB the lock is the server's named lock,
//
//	GET_LOCK(CONCAT('contend:', SHA2(key, 224)), timeout)
//
// which belongs to a session rather than a transaction: the guard holds a
// connection of the pool for each call, and fn's transaction commits or
// rolls back entirely while the lock is held, as on PostgreSQL. The package
// doc says what else differs; among it, no nesting.
//
// An Advisory is safe for simultaneous use by multiple goroutines and
// never closes the db it was given.
type Advisory struct {
	r    runner
	lock string // $1 key; NoWait: → bool
	// pool, on MySQL, hands out the connection each call holds its lock
	// on; nil on PostgreSQL.
	pool sqldb.ConnPool
}

var _ contend.Guard = (*Advisory)(nil)

// NewAdvisory validates cfg and returns an advisory guard on db, which is a
// pool or a caller's transaction, as for [NewLocker] (a single connection is
// refused); on MySQL (a handle wrapped
// by mysqldb.Wrap), a pool that hands out connections: a [*sql.DB] or
// sqlx's DB.
func NewAdvisory(db contend.DB, cfg AdvisoryConfig) (*Advisory, error) {
	if cfg.OnHeld != Wait && cfg.OnHeld != NoWait {
		return nil, fmt.Errorf("pessimistic: advisory locks take OnHeld Wait or NoWait, not %v: %w", cfg.OnHeld, contend.ErrInvalid)
	}
	r, err := newRunner(db, cfg.OnHeld, cfg.LockTimeout, cfg.FinishTimeout, cfg.Isolation, cfg.Retry, cfg.Observer)
	if err != nil {
		return nil, err
	}
	if r.db.Dialect() == sqldb.MySQL {
		return newMySQLAdvisory(r)
	}
	a := &Advisory{r: r, lock: `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`}
	if cfg.OnHeld == NoWait {
		a.lock = `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
	}
	return a, nil
}

// Do takes key's advisory lock and runs fn in the same transaction, which
// it commits when fn returns nil and rolls back otherwise, also when fn
// panics (re-raised). fn reaches the transaction with [contend.Querier]
// (pgxdb.Querier under pgx). It returns what [Locker.Do] does, never
// [contend.ErrNotFound].
func (a *Advisory) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if key == "" {
		return fmt.Errorf("pessimistic: advisory lock: empty key: %w", contend.ErrInvalid)
	}
	if fn == nil {
		return fmt.Errorf("pessimistic: advisory lock %q: nil fn: %w", key, contend.ErrInvalid)
	}
	what := func() string { return "advisory " + strconv.Quote(key) }
	if a.pool != nil {
		return a.lockSession(ctx, key, what, txFn(fn))
	}
	return a.r.run(ctx, what, func() string { return key }, func(ctx context.Context, tx sqldb.Tx) error {
		if a.r.mode == Wait {
			_, err := tx.Exec(ctx, a.lock, key)
			return err
		}
		var got bool
		if err := tx.QueryRow(ctx, a.lock, key).Scan(&got); err != nil {
			return err
		}
		if !got {
			return fmt.Errorf("held by another transaction: %w", contend.ErrConflict)
		}
		return nil
	}, txFn(fn))
}

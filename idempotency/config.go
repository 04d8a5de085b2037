package idempotency

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
)

// Config names the table of a [Store] and its columns, and says how long
// records live and what a call does when its key is in flight. Names are
// validated and quoted at construction; keys, fingerprints and answers are
// only ever bind parameters. The table is the caller's to create: see the
// package doc for its definition on PostgreSQL and MySQL.
type Config struct {
	// Table holds one record per key. It may be schema-qualified
	// ("app.idempotency_keys"). Required.
	Table string
	// KeyColumn holds the key, and must be the table's primary key (or
	// have a unique index of its own): a concurrent duplicate waits on that
	// index. Zero means "id".
	KeyColumn string
	// FingerprintColumn holds the fingerprint of the request that took the
	// key. Zero means "fingerprint".
	FingerprintColumn string
	// StateColumn is a small integer column: 0 while an external call is
	// in flight (see [Store.DoExternal]), 1 for a stored answer, 2 for a
	// stored final error. Zero means "state".
	StateColumn string
	// AnswerColumn holds fn's answer (bytea, LONGBLOB), or a final error's
	// message; NULL while in flight. Zero means "answer".
	AnswerColumn string
	// FenceColumn is a bigint column that holds the fencing token of the
	// attempt that took the key last. Zero means "fence".
	FenceColumn string
	// ExpiresColumn is a timestamp column (timestamptz, DATETIME(6)): when
	// a stored record expires, or when the lease of an external call in
	// flight ends. Index it for [Store.Expire]. Zero means "expires_at".
	ExpiresColumn string

	// Retention is how long a stored answer is replayed: a call after it
	// ends runs fn again, and [Store.Expire] removes the record. It is
	// counted on the database server's clock, from the statement that
	// takes the key ([Store.Do]) or records the answer
	// ([Store.DoExternal]). Zero means 24h.
	Retention time.Duration
	// Lease is how long an external call ([Store.DoExternal]) holds its
	// key: fn's ctx ends when it runs out, and the key may then be taken
	// by another call, which fences the first out. Zero means 30s.
	Lease time.Duration
	// NoWait makes a call whose key is in flight in another call (in this
	// process or another) return at once with an error matching
	// [ErrInFlight] (and [contend.ErrConflict]) instead of waiting for the
	// other call's answer. The HTTP middleware answers it with 409.
	NoWait bool
	// Isolation is the isolation level of the transactions a Store begins.
	// Zero means the server's default on PostgreSQL and READ COMMITTED on
	// MySQL and MariaDB; both servers keep the promises at READ COMMITTED
	// and REPEATABLE READ (a record committed while a call waited is read
	// with a locking read, which sees the latest commit).
	Isolation sql.IsolationLevel
	// Retry bounds how often a transaction that failed with a deadlock or a
	// serialization failure is run again, fn included. The zero value is
	// contend.Retry's defaults: 10 attempts.
	Retry contend.Retry
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction the Store owns; when it passes the outcome is unknown and
	// the call returns an error matching [context.DeadlineExceeded] (a
	// retry with the same key then finds out: it replays the answer if the
	// COMMIT was applied, and runs fn if not). Zero means 5s.
	FinishTimeout time.Duration
	// Observer, when set, hears how calls go, as events of strategy
	// "idempotency" keyed by the caller's key:
	//   - Obtained (Wait, Attempts, Fence) when a call takes the key and is
	//     about to run fn; Wait includes the wait for a duplicate in flight;
	//   - Released (Hold: fn and the commit; Err: fn's final error) when
	//     the answer is stored;
	//   - Conflict when a call ends without running fn: Err matches
	//     [ErrReplayed] when it replays a stored answer (Wait is how long it
	//     waited for the duplicate in flight that stored it), or
	//     [ErrInFlight] under NoWait;
	//   - Failed (Err matches [ErrMismatch]) when the key was used by
	//     another request; Failed with the error for a database error;
	//   - GaveUp when ctx ends a wait;
	//   - Lost (Fence, Err matching [ErrFenced]) when an external call's
	//     answer is refused because its lease ended and its key was taken
	//     or removed;
	//   - Expired (Fence) for each record [Store.Expire] removes, keyed by
	//     the record's key, once its batch committed.
	// It runs on the caller's goroutine and must not block. Zero means no
	// events, at no cost.
	Observer contend.Observer
}

// The defaults of Config, stated on its fields.
const (
	defaultRetention = 24 * time.Hour
	defaultLease     = 30 * time.Second
)

// names is a Config's identifiers, validated and quoted.
type names struct {
	table, key, fingerprint, state, answer, fence, expires string
}

func (c Config) names(d sqldb.Dialect) (names, error) {
	var n names
	cols := []struct {
		what, name, def string
		dst             *string
	}{
		{"table", c.Table, "", &n.table},
		{"key column", c.KeyColumn, "id", &n.key},
		{"fingerprint column", c.FingerprintColumn, "fingerprint", &n.fingerprint},
		{"state column", c.StateColumn, "state", &n.state},
		{"answer column", c.AnswerColumn, "answer", &n.answer},
		{"fence column", c.FenceColumn, "fence", &n.fence},
		{"expires column", c.ExpiresColumn, "expires_at", &n.expires},
	}
	seen := map[string]string{}
	for i, col := range cols {
		name := col.name
		if name == "" {
			name = col.def
		}
		q, err := sqlident.QuoteIn(d, "idempotency: "+col.what, name)
		if err != nil {
			return names{}, err
		}
		if i > 0 {
			if other, dup := seen[name]; dup {
				return names{}, fmt.Errorf("idempotency: the %s and the %s are both column %q: %w", other, col.what, name, contend.ErrInvalid)
			}
			seen[name] = col.what
		}
		*col.dst = q
	}
	return n, nil
}

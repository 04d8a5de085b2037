package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	stdatomic "sync/atomic"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/txn"
)

// The states of a record, as the state column holds them.
const (
	stateInFlight = 0 // an external call holds the key under a lease
	stateDone     = 1 // the answer is stored
	stateFailed   = 2 // a final error's message is stored
)

// savepoints names the savepoint a call in a caller's transaction sets
// before fn runs, so that a final error rolls back fn's writes and keeps
// the key's record: a name of its own per call, since MySQL replaces a
// savepoint by a later one of the same name, which a Do nested in fn's
// transaction would set. A call in a transaction of its own sets none: a
// final error rolls the whole transaction back, and the error is recorded
// in another (see Store.recordFailure), so that a first call costs no
// statement for a failure it will most likely not have.
var savepoints stdatomic.Uint64

func savepointName() string {
	return "contend_idempotency_" + strconv.FormatUint(savepoints.Add(1), 10)
}

// A Store runs a function once per key and remembers its answer, so that a
// retried request (a client that timed out, a double click, a job delivered
// twice) gets the first call's answer instead of its effect again. See the
// package doc for what each mode promises.
//
// A Store is safe for simultaneous use by multiple goroutines. It holds
// nothing between calls, so it has no Close; it never closes the db it was
// given.
type Store struct {
	db        sqldb.DB
	opts      txn.Options
	dialect   sqldb.Dialect
	retention time.Duration
	lease     time.Duration
	noWait    bool
	observer  contend.Observer

	lookupSQL   string // key → record
	lockedSQL   string // key → record, a locking read
	insertSQL   string // key, fingerprint, expiry µs → 1 row, or 0 (PostgreSQL) or a duplicate key (MySQL)
	takeoverSQL string // fingerprint, expiry µs, key
	fenceSQL    string // key → fence
	answerSQL   string // state, answer, key
	fencedSQL   string // state, answer, retention µs, key, fence
	releaseSQL  string // key, fence
	expireSQL   string // batch
	keyFence    string // the key and fence columns, for a RETURNING
	expiredSQL  string // batch → key, fence of expired records, locked (MySQL)
	removeSQL   string // DELETE by key, less its list of keys (MySQL)
}

// New validates cfg and builds the store's statements. db is a pool (a
// [*sql.DB] or sqlx's DB on PostgreSQL, a *pgxpool.Pool wrapped by
// pgxdb.Wrap, a MySQL or MariaDB pool wrapped by mysqldb.Wrap), on which
// each call begins its own transactions, or a transaction the caller owns,
// in which [Store.Do] runs and commits nothing. It fails with an error
// matching [contend.ErrInvalid] when db is nil, neither a pool nor a
// transaction, or a single connection, when a name is not a plain
// identifier or two columns share one, or when a duration is negative. It
// sends nothing to the database: a missing table shows at the first call.
func New(db contend.DB, cfg Config) (*Store, error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	for _, v := range []struct {
		what string
		d    time.Duration
	}{{"retention", cfg.Retention}, {"lease", cfg.Lease}, {"finish timeout", cfg.FinishTimeout}} {
		if v.d < 0 {
			return nil, fmt.Errorf("idempotency: %s %v is negative: %w", v.what, v.d, contend.ErrInvalid)
		}
	}
	dialect := d.Dialect()
	n, err := cfg.names(dialect)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:        d,
		opts:      txn.Options{Tx: dialect.GuardTx(cfg.Isolation), Retry: cfg.Retry, FinishTimeout: cfg.FinishTimeout},
		dialect:   dialect,
		retention: cfg.Retention,
		lease:     cfg.Lease,
		noWait:    cfg.NoWait,
		observer:  cfg.Observer,
	}
	if s.retention == 0 {
		s.retention = defaultRetention
	}
	if s.lease == 0 {
		s.lease = defaultLease
	}
	if s.opts.FinishTimeout == 0 {
		s.opts.FinishTimeout = txn.DefaultFinishTimeout
	}
	s.build(n)
	return s, nil
}

// build writes the statements. Every time is the server's, so that the
// processes sharing a table need no synchronised clocks: now is the
// server's clock, after adds a number of microseconds to it, and nowMicros
// is it as a number, the floor of a new fence.
func (s *Store) build(n names) {
	p := s.dialect.Param
	var now, nowMicros, lockRead string
	after := func(i int) string {
		return "clock_timestamp() + " + p(i) + "::bigint * interval '1 microsecond'"
	}
	if s.dialect == sqldb.MySQL {
		now, nowMicros, lockRead = "NOW(6)", "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)", " LOCK IN SHARE MODE"
		after = func(int) string { return "NOW(6) + INTERVAL ? MICROSECOND" }
	} else {
		now, nowMicros, lockRead = "clock_timestamp()", "(extract(epoch from clock_timestamp()) * 1000000)::bigint", " FOR SHARE"
	}
	s.lookupSQL = fmt.Sprintf("SELECT %s, %s, %s, %s, CASE WHEN %s > %s THEN 1 ELSE 0 END FROM %s WHERE %s = %s",
		n.fingerprint, n.state, n.answer, n.fence, n.expires, now, n.table, n.key, p(1))
	s.lockedSQL = s.lookupSQL + lockRead
	s.insertSQL = fmt.Sprintf("INSERT INTO %s (%s, %s, %s, %s, %s, %s) VALUES (%s, %s, %d, NULL, %s, %s)",
		n.table, n.key, n.fingerprint, n.state, n.answer, n.fence, n.expires, p(1), p(2), stateInFlight, nowMicros, after(3))
	if s.dialect == sqldb.Postgres {
		// A duplicate waits here for the transaction that inserted the key
		// to end, then inserts nothing if it committed.
		s.insertSQL += " ON CONFLICT DO NOTHING"
	}
	s.takeoverSQL = fmt.Sprintf("UPDATE %s SET %s = %s, %s = %d, %s = NULL, %s = GREATEST(%s + 1, %s), %s = %s WHERE %s = %s",
		n.table, n.fingerprint, p(1), n.state, stateInFlight, n.answer, n.fence, n.fence, nowMicros, n.expires, after(2), n.key, p(3))
	s.fenceSQL = fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", n.fence, n.table, n.key, p(1))
	// Do's record got its expiry when the key was taken, in the same
	// transaction: the answer leaves the indexed columns alone, so that
	// PostgreSQL can update the row in place (HOT), without new index
	// entries.
	s.answerSQL = fmt.Sprintf("UPDATE %s SET %s = %s, %s = %s WHERE %s = %s",
		n.table, n.state, p(1), n.answer, p(2), n.key, p(3))
	s.fencedSQL = fmt.Sprintf("UPDATE %s SET %s = %s, %s = %s, %s = %s WHERE %s = %s AND %s = %s AND %s = %d",
		n.table, n.state, p(1), n.answer, p(2), n.expires, after(3), n.key, p(4), n.fence, p(5), n.state, stateInFlight)
	s.releaseSQL = fmt.Sprintf("DELETE FROM %s WHERE %s = %s AND %s = %s AND %s = %d",
		n.table, n.key, p(1), n.fence, p(2), n.state, stateInFlight)
	// A batch reads the expiry index from its start: the time it compares
	// with is the statement's (now(), NOW(6)), which the planner can use
	// on the index; clock_timestamp(), volatile, would make every batch
	// scan the table past the dead rows of the batches before it.
	s.keyFence = n.key + ", " + n.fence
	if s.dialect == sqldb.MySQL {
		s.expireSQL = fmt.Sprintf("DELETE FROM %s WHERE %s <= NOW(6) ORDER BY %s LIMIT ?", n.table, n.expires, n.expires)
		s.expiredSQL = fmt.Sprintf("SELECT %s, %s FROM %s WHERE %s <= NOW(6) ORDER BY %s LIMIT ? FOR UPDATE SKIP LOCKED",
			n.key, n.fence, n.table, n.expires, n.expires)
		s.removeSQL = fmt.Sprintf("DELETE FROM %s WHERE %s IN", n.table, n.key)
	} else {
		// SKIP LOCKED: a batch never waits for a call that is taking an
		// expired key over.
		// = ANY(ARRAY(...)): the rows are found by their key, where IN
		// would hash-join a scan of the whole table.
		s.expireSQL = fmt.Sprintf("DELETE FROM %s WHERE %s = ANY(ARRAY(SELECT %s FROM %s WHERE %s <= now() ORDER BY %s LIMIT $1 FOR UPDATE SKIP LOCKED))",
			n.table, n.key, n.key, n.table, n.expires, n.expires)
	}
}

// A record is a key's row as a call reads it.
type record struct {
	fingerprint string
	state       int64
	answer      []byte
	fence       int64
	live        int64 // 1 before its expiry, 0 after
}

func (r *record) dest() []any {
	return []any{&r.fingerprint, &r.state, &r.answer, &r.fence, &r.live}
}

// read reads key's record with query on q; found is false when there is
// none. The record is read into a value of its own: a read given up on
// (see txn.Watch) may still write it.
func read(ctx context.Context, q sqldb.Querier, query, key string) (rec *record, found bool, err error) {
	r := &record{}
	err = scanRow(ctx, q, query, []any{key}, r.dest()...)
	switch {
	case sqldb.NoRows(err):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return r, true, nil
}

// scanRow runs a query that returns at most one row and scans it into dest,
// watched (see txn.Watch) where the driver's statements do not end with ctx.
func scanRow(ctx context.Context, q sqldb.Querier, query string, args []any, dest ...any) error {
	return txn.PreferCtx(ctx, txn.WatchScan(ctx, q, query, args, dest))
}

func exec(ctx context.Context, q sqldb.Querier, query string, args ...any) (int64, error) {
	n, err := txn.WatchExec(ctx, q, query, args)
	return n, txn.PreferCtx(ctx, err)
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// errNotTaken ends a transaction that found the key's record: it rolls back
// and the call answers from the record.
var errNotTaken = errors.New("idempotency: key taken")

// take takes key for fingerprint in tx, the record to expire after
// expiry: it inserts the key's record, or, when an expired one is in the
// way, takes that over. A duplicate in flight in another transaction makes
// the insert wait until that transaction ends (or, under NoWait, fail with
// [ErrInFlight]). When the key has a live record, take returns it with
// errNotTaken, which ends tx.
func (s *Store) take(ctx context.Context, tx sqldb.Tx, key, fingerprint string, expiry time.Duration) (*record, error) {
	restore, err := s.noWaitOn(ctx, tx)
	if err != nil {
		return nil, err
	}
	rec, taken, err := s.takeLoop(ctx, tx, key, fingerprint, expiry)
	if rerr := restore(err); rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	switch {
	case err != nil && s.noWait && sqlerr.Is(err, sqlerr.LockNotAvailable) && context.Cause(ctx) == nil:
		return nil, fmt.Errorf("idempotency: %q: %w (%w)", key, ErrInFlight, err)
	case err != nil:
		return nil, err
	case !taken:
		return rec, errNotTaken
	}
	return nil, nil
}

func (s *Store) takeLoop(ctx context.Context, tx sqldb.Tx, key, fingerprint string, expiry time.Duration) (*record, bool, error) {
	// A record removed between the insert that found it and the read
	// (Expire, an external call's release) sends the call round again.
	for range 3 {
		n, err := exec(ctx, tx, s.insertSQL, key, fingerprint, micros(expiry))
		switch {
		case err == nil && n == 1:
			return nil, true, nil
		case err != nil && !sqlerr.Is(err, sqlerr.UniqueViolation):
			return nil, false, err
		}
		// The key has a committed record (a duplicate in flight has ended):
		// a locking read sees it even where a plain one would read an older
		// snapshot (MySQL's REPEATABLE READ).
		rec, found, err := read(ctx, tx, s.lockedSQL, key)
		if err != nil {
			return nil, false, err
		}
		if !found {
			continue
		}
		if rec.live == 1 {
			return rec, false, nil
		}
		// Expired: an answer past its retention, or an external call whose
		// lease ended. Take it over; the fence moves on.
		if _, err := exec(ctx, tx, s.takeoverSQL, fingerprint, micros(expiry), key); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("idempotency: %q: the record came and went three times in a row: %w", key, contend.ErrConflict)
}

// noWaitOn makes tx's lock waits fail at once, under NoWait, until
// restore. PostgreSQL sets lock_timeout to 1ms for the transaction and puts
// the caller's setting back; MySQL sets the session's
// innodb_lock_wait_timeout to 0 (MariaDB: no wait; MySQL 8 rounds it up to
// 1s) and puts it back, even when the statement failed, since the setting
// outlives the transaction.
func (s *Store) noWaitOn(ctx context.Context, tx sqldb.Tx) (restore func(error) error, err error) {
	if !s.noWait {
		return func(error) error { return nil }, nil
	}
	if s.dialect == sqldb.MySQL {
		if _, err := exec(ctx, tx, "SET @contend_idem_lwt = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = 0"); err != nil {
			return nil, fmt.Errorf("idempotency: set innodb_lock_wait_timeout: %w", err)
		}
		return func(error) error {
			rctx := ctx
			if ctx.Err() != nil {
				var cancel context.CancelFunc
				rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), txn.CancelGrace)
				defer cancel()
			}
			err := sqldb.SessionExec(rctx, tx, "SET SESSION innodb_lock_wait_timeout = @contend_idem_lwt, @contend_idem_lwt = NULL")
			if err != nil {
				return fmt.Errorf("idempotency: restore innodb_lock_wait_timeout: %w", err)
			}
			return nil
		}, nil
	}
	var prev, set string
	if err := scanRow(ctx, tx, "SELECT current_setting('lock_timeout'), set_config('lock_timeout', '1', true)", nil, &prev, &set); err != nil {
		return nil, fmt.Errorf("idempotency: set lock_timeout: %w", err)
	}
	return func(err error) error {
		if sqlerr.Code(err) != "" {
			// The error aborted the transaction, whose rollback undoes the
			// setting.
			return nil
		}
		if _, err := exec(ctx, tx, "SELECT set_config('lock_timeout', "+s.dialect.Param(1)+", true)", prev); err != nil {
			return fmt.Errorf("idempotency: restore lock_timeout: %w", err)
		}
		return nil
	}, nil
}

// answerOf is a call's answer from rec, a live record it did not take.
func (s *Store) answerOf(key, fingerprint string, rec *record) ([]byte, bool, error) {
	if rec.fingerprint != fingerprint {
		return nil, false, fmt.Errorf("idempotency: %q: %w", key, ErrMismatch)
	}
	switch rec.state {
	case stateDone:
		return rec.answer, true, nil
	case stateFailed:
		return nil, true, &failedError{msg: string(rec.answer)}
	case stateInFlight:
		return nil, false, fmt.Errorf("idempotency: %q: an external call holds the key under its lease: %w", key, ErrInFlight)
	}
	return nil, false, fmt.Errorf("idempotency: %q: the record has state %d, which no Store writes", key, rec.state)
}

func checkArgs(op, key string, fnNil bool) error {
	if key == "" {
		return fmt.Errorf("idempotency: %s: empty key: %w", op, contend.ErrInvalid)
	}
	if fnNil {
		return fmt.Errorf("idempotency: %s %q: nil fn: %w", op, key, contend.ErrInvalid)
	}
	return nil
}

// Do runs fn once for key, in a transaction that also stores fn's answer
// under key, and returns the answer; a later call with the key and the same
// fingerprint returns the stored answer without running fn, with replayed
// true. fn reaches the transaction through [contend.Querier] (database/sql)
// or pgxdb.Querier (pgx): its writes and the key's record commit together,
// or neither does.
//
// fingerprint identifies the request the key stands for (a hash of its
// payload, say); a call whose key was used with another fingerprint runs
// nothing and returns an error matching [ErrMismatch]. A call whose key is
// in flight in another call, in any process, waits for that call's
// transaction to end (bounded by ctx), then replays its answer, or runs fn
// itself if that call rolled back; under [Config.NoWait] it returns an
// error matching [ErrInFlight] at once.
//
// fn's error is final unless marked with [Transient]: its writes roll back,
// its message is stored, and Do returns an error matching [ErrFailed] that
// wraps it; later calls replay an error with the same message that matches
// ErrFailed. In a transaction of its own, Do rolls fn's writes back with
// the whole transaction and stores the message in another: a duplicate
// that waited for the key may take it in between and run fn itself, and
// then both calls return that call's answer. When the message cannot be
// stored (ctx ended, a database error), Do returns an error that wraps fn's
// and does not match ErrFailed, and a retry runs fn again. A transient error rolls
// everything back and is returned as it is; so, without a mark, is an error
// that comes with ctx's end, a database or network error, an error matching
// [contend.ErrConflict] or [contend.ErrLockLost] (a nested guard's lost
// race), and any error once the server rolled the transaction back. A
// deadlock or serialization failure runs the transaction again, fn
// included, under [Config.Retry]. A panic in fn rolls back and propagates.
//
// Inside a transaction (db is one, or ctx carries one from another SQL
// guard's fn) Do runs in it and commits nothing: the answer is stored when
// the owner commits. A Do on a pool first reads the key's record outside
// any transaction, so a replay costs one primary-key read.
func (s *Store) Do(ctx context.Context, key, fingerprint string, fn func(ctx context.Context) ([]byte, error)) (answer []byte, replayed bool, err error) {
	if err := checkArgs("do", key, fn == nil); err != nil {
		return nil, false, err
	}
	rep := s.newReport(key)
	h, err := txn.Resolve(ctx, s.db)
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: do %q: %w", key, err)
	}
	if h.Owned() {
		rec, found, err := read(ctx, s.db, s.lookupSQL, key)
		if err != nil {
			err = fmt.Errorf("idempotency: do %q: read the record: %w", key, err)
			rep.failed(ctx, err)
			return nil, false, err
		}
		if found && rec.live == 1 {
			answer, replayed, err = s.answerOf(key, fingerprint, rec)
			rep.answered(ctx, replayed, err)
			return answer, replayed, err
		}
	}
	var (
		rec   *record
		out   []byte
		final error
		fnErr error // a transient error of fn's, returned as it is
	)
	attempts, err := txn.RunTx(ctx, s.db, s.opts, func(ctx context.Context, tx sqldb.Tx) error {
		rec, out, final, fnErr = nil, nil, nil, nil
		var err error
		if rec, err = s.take(ctx, tx, key, fingerprint, s.retention); err != nil {
			return err
		}
		rep.obtained(ctx, 0)
		var savepoint string
		if !h.Owned() {
			savepoint = savepointName()
			if _, err := exec(ctx, tx, "SAVEPOINT "+savepoint); err != nil {
				return err
			}
		}
		answer, ferr := fn(ctx)
		state := int64(stateDone)
		if ferr != nil {
			if transient(ctx, tx, ferr) {
				fnErr = ferr
				return ferr
			}
			final = ferr
			if h.Owned() {
				return errFinal
			}
			if _, err := exec(ctx, tx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
				return errors.Join(ferr, err)
			}
			state, answer = stateFailed, []byte(ferr.Error())
		}
		n, err := exec(ctx, tx, s.answerSQL, state, answer, key)
		if err != nil {
			return fmt.Errorf("idempotency: do %q: store the answer: %w", key, err)
		}
		if n != 1 {
			return fmt.Errorf("idempotency: do %q: the record this transaction holds is gone (%d rows)", key, n)
		}
		out = answer
		return nil
	})
	if rep != nil {
		rep.attempts = attempts
	}
	switch {
	case errors.Is(err, errNotTaken) && rec != nil:
		answer, replayed, err = s.answerOf(key, fingerprint, rec)
		rep.answered(ctx, replayed, err)
		return answer, replayed, err
	case errors.Is(err, errFinal) && final != nil:
		return s.recordFailure(ctx, rep, key, fingerprint, final)
	case err != nil:
		if !errors.Is(err, ErrInFlight) && context.Cause(ctx) == nil && (fnErr == nil || err != fnErr) {
			err = fmt.Errorf("idempotency: do %q: %w", key, err)
		}
		rep.ended(ctx, err)
		return nil, false, err
	case final != nil:
		err = &failedError{msg: final.Error(), err: final}
		rep.released(ctx, final)
		return nil, false, err
	}
	rep.released(ctx, nil)
	return out, false, nil
}

// errFinal ends a transaction of the Store's own whose fn returned a final
// error: it rolls back, fn's writes with the key's record, and the error
// is recorded after (see Store.recordFailure).
var errFinal = errors.New("idempotency: final error")

// recordFailure records fn's final error under key, in a transaction of its
// own, after the transaction fn ran in rolled back. The key was free for
// that moment: a duplicate that waited for it may have taken it, and run
// fn itself. Then that call's record is the key's, and this call answers
// from it, as every later call will, so that every caller with the key
// gets the same answer.
func (s *Store) recordFailure(ctx context.Context, rep *report, key, fingerprint string, final error) ([]byte, bool, error) {
	var rec *record
	msg := []byte(final.Error())
	_, err := txn.RunTx(ctx, s.db, s.opts, func(ctx context.Context, tx sqldb.Tx) error {
		rec = nil
		var err error
		if rec, err = s.take(ctx, tx, key, fingerprint, s.retention); err != nil {
			return err
		}
		n, err := exec(ctx, tx, s.answerSQL, int64(stateFailed), msg, key)
		if err == nil && n != 1 {
			err = fmt.Errorf("the record this transaction holds is gone (%d rows)", n)
		}
		return err
	})
	rep.released(ctx, final)
	switch {
	case errors.Is(err, errNotTaken) && rec != nil:
		return s.answerOf(key, fingerprint, rec)
	case err != nil:
		// fn's writes rolled back, and nothing is stored: a retry runs fn
		// again, as after a transient error.
		if context.Cause(ctx) == nil {
			err = fmt.Errorf("idempotency: do %q: record fn's final error: %w", key, err)
		}
		return nil, false, fmt.Errorf("%w (fn's final error, not recorded: %w)", err, final)
	}
	return nil, false, &failedError{msg: final.Error(), err: final}
}

// Expire removes the records whose retention ended (and the records of
// external calls whose lease ended: such a key's next call runs fn again
// either way), in batches of at most batch rows, each one statement and
// so one short transaction of its own, until none is left or ctx ends. It
// returns how many it removed. A batch of 0 means 1000; a negative one is
// an error matching [contend.ErrInvalid]. On PostgreSQL a batch skips
// records that a call is taking over rather than wait for it.
//
// Call it from a ticker in one process or several (batches do not
// conflict), or from a cron job: nothing else removes records, and a
// table nobody expires grows with every key. On a transaction (db is one)
// it runs in that transaction.
//
// With a [Config.Observer], Expire reports an [contend.EventExpired] for
// each record it removed, after its batch committed. On MySQL and MariaDB,
// whose DELETE cannot return what it removed, each batch is then two
// statements in a transaction (the expired keys read and locked, then
// removed by key), of at most 10,000 records.
func (s *Store) Expire(ctx context.Context, batch int) (removed int64, err error) {
	if batch < 0 {
		return 0, fmt.Errorf("idempotency: expire: batch %d is negative: %w", batch, contend.ErrInvalid)
	}
	if batch == 0 {
		batch = 1000
	}
	if s.observer != nil && s.dialect == sqldb.MySQL {
		batch = min(batch, maxKeysPerStatement)
	}
	for {
		var n int64
		var err error
		if s.observer == nil {
			n, err = exec(ctx, s.db, s.expireSQL, batch)
		} else {
			n, err = s.expireReporting(ctx, batch)
		}
		removed += n
		if err != nil {
			return removed, fmt.Errorf("idempotency: expire (after %d removed): %w", removed, err)
		}
		if n < int64(batch) {
			return removed, nil
		}
	}
}

// maxKeysPerStatement bounds the keys a statement lists as parameters
// (MySQL takes at most 65,535).
const maxKeysPerStatement = 10_000

// expiredRecord is a record Expire removed, as its event tells it.
type expiredRecord struct {
	key   string
	fence int64
}

// expireReporting removes one batch and reports each record it removed,
// once they are gone for good: on PostgreSQL the batch's DELETE returns
// them; MySQL's DELETE cannot, so a batch there is a transaction that
// locks the expired records with their keys read, then removes those.
func (s *Store) expireReporting(ctx context.Context, batch int) (int64, error) {
	var gone []expiredRecord
	var err error
	if s.dialect == sqldb.MySQL {
		_, err = txn.RunTx(ctx, s.db, s.opts, func(ctx context.Context, tx sqldb.Tx) error {
			var err error
			gone, err = queryExpired(ctx, tx, s.expiredSQL, batch)
			if err != nil || len(gone) == 0 {
				return err
			}
			args := make([]any, len(gone))
			for i, g := range gone {
				args[i] = g.key
			}
			del := s.removeSQL + " (?" + strings.Repeat(", ?", len(gone)-1) + ")"
			n, err := exec(ctx, tx, del, args...)
			if err == nil && n != int64(len(gone)) {
				err = fmt.Errorf("%d of %d locked records removed", n, len(gone))
			}
			return err
		})
	} else {
		gone, err = queryExpired(ctx, s.db, s.expireSQL+" RETURNING "+s.keyFence, batch)
	}
	if err != nil {
		return 0, err
	}
	for _, g := range gone {
		s.observer.Observe(ctx, contend.Event{Kind: contend.EventExpired, Strategy: strategy, Key: g.key, Fence: g.fence})
	}
	return int64(len(gone)), nil
}

// queryExpired runs query, which returns the key and fence of expired
// records, watched (see txn.Watch), and returns its rows.
func queryExpired(ctx context.Context, q sqldb.Querier, query string, batch int) ([]expiredRecord, error) {
	var got []expiredRecord
	err := txn.Watch(ctx, q, func() error {
		rows, err := q.Query(ctx, query, batch)
		if err != nil {
			return err
		}
		defer rows.Close()
		var rs []expiredRecord
		for rows.Next() {
			var r expiredRecord
			if err := rows.Scan(&r.key, &r.fence); err != nil {
				return err
			}
			rs = append(rs, r)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		got = rs
		return nil
	})
	if err != nil {
		return nil, txn.PreferCtx(ctx, err)
	}
	return got, nil
}

package atomic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	syncatomic "sync/atomic"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
	"github.com/contend/contend/internal/firstuse"
	"github.com/contend/contend/internal/inflight"
	"github.com/contend/contend/internal/keepalive"
	"github.com/contend/contend/internal/keyrate"
	"github.com/contend/contend/internal/share"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/sqlident"
	"github.com/contend/contend/internal/token"
	"github.com/contend/contend/internal/txn"
)

// ClaimerConfig names the table and columns a [Claimer] works on. Names are
// validated and quoted at construction; keys and tokens are only ever bind
// parameters.
type ClaimerConfig struct {
	// Table holds one row per key; rows must exist before they are claimed.
	// It may be schema-qualified ("app.bots"). Required.
	Table string
	// KeyColumn identifies the row. Default: "id".
	KeyColumn string
	// OwnerColumn is a nullable text column: NULL when free, the holder's
	// token when claimed. Default: "owner".
	OwnerColumn string
	// LeaseColumn, when set, is a nullable timestamptz column holding the
	// claim's deadline. A claim whose deadline has passed can be taken over,
	// so a claim whose release was lost (a crash, a network failure) frees
	// itself. Default: "" (claims hold until released).
	LeaseColumn string
	// Lease is how long a claim holds when LeaseColumn is set; [Claimer.Do]
	// extends it every Lease/3 while fn runs. The deadline is computed by the
	// database's clock as the claim's statement runs (also inside a long
	// transaction), so instances' clocks need not agree. Default: 30s.
	Lease time.Duration
	// FinishTimeout bounds the release [Claimer.Do] makes after fn, and the
	// one of a claim whose outcome is unknown (see [Claimer.Claim]), which
	// they make even when ctx has ended. When the bound passes without an
	// answer (a network gone silent), Do returns an error matching
	// [context.DeadlineExceeded] and the claim may still be held: until its
	// lease passes, or, without a lease column, until cleared. Default: 5s.
	FinishTimeout time.Duration
	// Observer, when set, hears what the claimer's claims do, as events of
	// strategy "atomic" (Attempts is always 1: a claim is one try, never
	// retried):
	//   - Obtained when Claim, ClaimAs or Do makes a claim (Wait is how long
	//     it took: its statement, and on a hot key the one it waited for);
	//   - Conflict when the key was claimed already (Err is the error
	//     returned);
	//   - Released when Release or the end of Do clears the claim (Hold
	//     since the claim, when this Claimer made it; Err is fn's error);
	//   - Lost when a release or an extension finds the claim gone, taken
	//     over or cleared (Err matches [contend.ErrLockLost]);
	//   - GaveUp when ctx ends a claim's statement;
	//   - Failed when a statement errs, or the key has no row.
	// It runs on the caller's goroutine, on the one extending Do's lease,
	// or on the one releasing a claim whose outcome was unknown, and must
	// not block. Default: nil, no events, at no cost.
	Observer contend.Observer
}

// defaultLease is the default of [ClaimerConfig.Lease].
const defaultLease = 30 * time.Second

// When a key's claims share their statement (claimRow). Sharing makes a
// claim wait for the statement in flight, and on MySQL adds a read to a
// winner's round trip, so it pays once about half of a key's recent claims
// lost; the key goes back at a quarter, and stays at least half a window in
// either state, so that a rate near a threshold does not flap. A key's rate
// is the mean of its claims until it has 32 (the window), so a new key turns
// hot at its first lost claim unless more claims won before it; a key
// claimed by one caller at a time, however often, never turns. lossKeys bounds the memory (about 40 bytes a key, per
// Claimer on a pool); a hot key keeps its slot against cold ones, so it
// need not cover every key claimed, only the keys hot at once.
const (
	lossWindow = 32
	lossEnter  = 0.5
	lossLeave  = 0.25
	lossKeys   = 1024
)

// A Claimer claims keys by filling an owner column where it is empty: one
// conditional UPDATE, so of any number of concurrent claims on a key, in any
// number of processes, exactly one succeeds, and no lock is held anywhere while
// the winner works. Release empties the column only while it still holds the
// releaser's token, so a late release never clears a newer claim.
//
// A key whose claims keep losing (about half of this Claimer's recent
// claims of it, outside a transaction) turns hot, and the claims of it
// that this Claimer makes at once share one statement: at most one is in
// flight per key, and a claim takes the answer only of a statement that
// began after the claim did, so a claim that comes while one is in flight
// waits for it to end and shares the next. On PostgreSQL the statement
// shared is the claim itself, made with the token of the claim that sends
// it: when it wins, that claim holds the key and the others fail with
// [contend.ErrConflict] (the key was held, by it, at a moment within their
// calls), as all do when it loses; a missing row is [contend.ErrNotFound]
// for all. On MySQL and MariaDB, where every UPDATE locks the row it
// reads, a loser's too, it is a plain read that takes no lock and waits
// for none: a key held fails the claims with ErrConflict without a write,
// a missing row with ErrNotFound, and a free key is claimed by each as any
// key (a winner pays two round trips). A claim waits for at most the
// statement in flight and the one it shares (once more if the claim that
// sent it gave up before the answer came), never past its ctx, and holds
// no connection while it waits. A key claimed by one caller at a time
// never turns hot, however often it is claimed. Which keys are hot is
// remembered per Claimer, in memory bounded whatever the keys (a few tens
// of kilobytes).
//
// A claim lasts until released or, with a lease column, until its lease
// passes. Without a lease a crashed holder's claim stays until cleared by
// hand; with one, another caller can take it over once the lease passes, and
// the old holder's release then reports false.
//
// As a [contend.Guard], Do claims, runs fn, and releases, also when fn fails
// or panics. It fails fast: a held key gives [contend.ErrConflict] at once,
// never a wait. fn runs at most once per call and never in a transaction of
// the claimer's ([contend.Querier] gives fn the db it passes).
//
// Every method joins the transaction ctx carries (fn of a SQL guard), as
// every SQL guard of this module does, so a claim nested in a row lock's fn
// never waits for a lock its own goroutine holds; see [Claimer.Do] for what
// a claim means inside a transaction.
//
// A Claimer is safe for simultaneous use by multiple goroutines. It
// prepares its statements at its first call (see [NewClaimer]) and owns
// them, and the goroutines that release claims whose outcome was unknown:
// [Claimer.Close] waits for those and closes the statements. It never
// closes the db it was given.
type Claimer struct {
	lease  time.Duration // 0 without a lease column
	finish time.Duration
	onTx   bool // built on a transaction, where its statements are prepared
	db     sqldb.DB
	table  string // as configured, for messages
	plan   plan   // the statements to prepare
	holds  keepalive.Timers

	observer contend.Observer // nil: report nothing
	tracked  claims           // of Claim and ClaimAs, when observed

	// losses keeps, per key, how often this claimer's recent claims made
	// outside a transaction lost: the claims of a key that turned hot share
	// their statement (claimRow). It is the one owner of that state. nil on a
	// transaction, whose claims always run the claim's statement.
	losses *keyrate.Table
	// hot is the statement of hot keys, shared by the claims that want
	// it at once (hotStatement). nil on a transaction, as losses.
	hot *share.Calls

	prep  firstuse.Step                // prepares stmts at the first call
	stmts syncatomic.Pointer[prepared] // nil until prepared; set once

	// unsure runs the releases of claims whose outcome is unknown, each on
	// a goroutine of its own, within finish; Close waits for them.
	unsure inflight.Group

	mu          sync.Mutex      // protects the transitions of closed and stmtsClosed
	closed      syncatomic.Bool // set by Close; read without mu by every call
	stmtsClosed bool            // the prepared statements were closed
}

var _ contend.Guard = (*Claimer)(nil)

// NewClaimer validates cfg and returns a claimer on db: a pool ([*sql.DB],
// sqlx's DB, a *pgxpool.Pool wrapped by pgxdb.Wrap, a MySQL pool wrapped by
// mysqldb.Wrap) or a caller's transaction ([*sql.Tx], sqlx's Tx, a wrapped
// pgx.Tx). A single connection ([*sql.Conn], a wrapped *pgx.Conn or
// *pgxpool.Conn) is refused with an error matching [contend.ErrInvalid], as
// by every SQL guard: it is one server session, where nested calls'
// transactions would be one; pass the pool it came from. It fails, with an
// error matching [contend.ErrInvalid], when db is none of these, when a
// name is not a plain identifier, or when a duration is negative.
//
// NewClaimer does no I/O. The claimer's first call prepares its statements
// (on database/sql; pgx prepares and caches each one itself), under that
// call's ctx: a table or column that does not exist shows in its error.
// Preparation is remembered once it succeeded; one that failed (ctx ended,
// the network failed) is made again by the next call. Calls that need the
// statements while another call prepares them wait for it, each no longer
// than its own ctx.
func NewClaimer(db contend.DB, cfg ClaimerConfig) (*Claimer, error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return nil, fmt.Errorf("atomic: %w", err)
	}
	if cfg.KeyColumn == "" {
		cfg.KeyColumn = "id"
	}
	if cfg.OwnerColumn == "" {
		cfg.OwnerColumn = "owner"
	}
	if cfg.Lease < 0 {
		return nil, fmt.Errorf("atomic: lease %v is negative: %w", cfg.Lease, contend.ErrInvalid)
	}
	if cfg.Lease == 0 {
		cfg.Lease = defaultLease
	}
	if cfg.FinishTimeout < 0 {
		return nil, fmt.Errorf("atomic: finish timeout %v is negative: %w", cfg.FinishTimeout, contend.ErrInvalid)
	}
	if cfg.FinishTimeout == 0 {
		cfg.FinishTimeout = txn.DefaultFinishTimeout
	}
	table, err := sqlident.QuoteIn(d.Dialect(), "atomic: table", cfg.Table)
	if err != nil {
		return nil, err
	}
	key, err := sqlident.QuoteIn(d.Dialect(), "atomic: key column", cfg.KeyColumn)
	if err != nil {
		return nil, err
	}
	owner, err := sqlident.QuoteIn(d.Dialect(), "atomic: owner column", cfg.OwnerColumn)
	if err != nil {
		return nil, err
	}
	lease := ""
	if cfg.LeaseColumn != "" {
		if lease, err = sqlident.QuoteIn(d.Dialect(), "atomic: lease column", cfg.LeaseColumn); err != nil {
			return nil, err
		}
	}
	c := &Claimer{finish: cfg.FinishTimeout, onTx: d.Tx() != nil, db: d, table: cfg.Table, observer: cfg.Observer}
	if !c.onTx {
		c.losses = keyrate.New(keyrate.Config{Window: lossWindow, Enter: lossEnter, Leave: lossLeave, Keys: lossKeys})
		c.hot = share.New(c.hotStatement)
	}
	if lease != "" {
		c.lease = cfg.Lease
	}
	if d.Dialect() == sqldb.MySQL {
		c.plan = mysqlPlan(table, key, owner, lease)
	} else {
		c.plan = postgresPlan(table, key, owner, lease)
	}
	return c, nil
}

// postgresPlan returns the claimer's statements on PostgreSQL; lease is the
// quoted lease column, or "" without one.
func postgresPlan(table, key, owner, lease string) plan {
	// Plain UPDATEs under READ COMMITTED are enough: of two concurrent claims,
	// the second waits for the first's row lock and then re-checks its WHERE
	// against the committed row, where the owner is no longer NULL.
	free := owner + ` IS NULL`
	claimSQL := fmt.Sprintf(`UPDATE %s SET %s = $2 WHERE %s = $1 AND %s`, table, owner, key, free)
	releaseSQL := fmt.Sprintf(`UPDATE %s SET %s = NULL WHERE %s = $1 AND %s = $2`, table, owner, key, owner)
	var extendSQL string
	if lease != "" {
		// clock_timestamp(), not now(): now() is the start of the
		// transaction, and a claim or an extension made in a caller's
		// transaction older than the lease would commit a lease already
		// passed, which another instance could take at once.
		deadline := `clock_timestamp() + $3::bigint * interval '1 microsecond'`
		free = fmt.Sprintf(`(%s IS NULL OR %s < clock_timestamp())`, owner, lease)
		claimSQL = fmt.Sprintf(`UPDATE %s SET %s = $2, %s = %s WHERE %s = $1 AND %s`,
			table, owner, lease, deadline, key, free)
		releaseSQL = fmt.Sprintf(`UPDATE %s SET %s = NULL, %s = NULL WHERE %s = $1 AND %s = $2`,
			table, owner, lease, key, owner)
		// An expired claim is not extended even if nobody took it yet: its
		// holder was told it was lost (or will be), so reviving it would let
		// two parties believe they hold the key.
		extendSQL = fmt.Sprintf(`UPDATE %s SET %s = %s WHERE %s = $1 AND %s = $2 AND %s >= clock_timestamp()`,
			table, lease, deadline, key, owner, lease)
	}
	// A claim is the bare UPDATE: a win costs one round trip and the
	// server what any conditional UPDATE does. A claim that matched no row
	// asks whether the row exists, in a statement of its own (probedClaim),
	// which sees a row deleted while the UPDATE waited for its lock.
	//
	// The claims of a hot key, most of which lose, share one statement
	// (claimRow) that tells a win, a lost race and a missing row apart in
	// one round trip, in the count of rows it reports: the UPDATE in the
	// WITH runs to completion whatever the outer query reads; the outer
	// query sees the row as the statement began, and gives no row after a
	// claim, one when the row was held then, and two when it was not there
	// or free (free then and not claimed: taken or deleted while the UPDATE
	// waited, which the same probe tells). It costs the server more than
	// the bare UPDATE (about 10% more per claim and release, with pgbench),
	// so only a hot key pays it. A losing UPDATE takes no row lock and
	// costs the server what a read of the row does, so a hot key's claims
	// share the claim itself rather than a read.
	hotSQL := fmt.Sprintf(`WITH claimed AS (%s RETURNING 1) SELECT FROM (VALUES (1), (2)) AS outcome (n) `+
		`WHERE NOT EXISTS (SELECT FROM claimed) AND (n = 1 OR NOT EXISTS (SELECT FROM %s WHERE %s = $1 AND %s IS NOT TRUE))`,
		claimSQL, table, key, free)
	existsSQL := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s WHERE %s = $1)`, table, key)
	return plan{claim: claimSQL, exists: existsSQL, hot: hotSQL, hotClaims: true, release: releaseSQL, extend: extendSQL,
		won: 1, unsure: 0}
}

// A plan is a claimer's statements, to be prepared at its first call: their
// text, the order each takes the claimer's arguments in (nil: as passed,
// key, token and the lease), and the counts of the claim's statement that
// tell a win (won) and a result it cannot tell (unsure; see probedClaim).
// hot is the statement a hot key's claims share: a claim that tells its
// outcome in one round trip (hotClaims: PostgreSQL), or a read that
// answers in a value (MySQL, whose drivers count no rows of a SELECT).
type plan struct {
	claim, exists, hot, release, extend string // extend: "" without a lease column
	lockedExists                        string // MySQL's probe in a transaction; "" on PostgreSQL
	hotClaims                           bool
	claimOrder, extendOrder             []int
	won, unsure                         int64
}

// prepared is a claimer's statements, prepared.
type prepared struct {
	claim   sqldb.Stmt // key, token [, lease µs] → 0: claimed, 1: held, 2: no row
	hot     sqldb.Stmt // the claim's answer in one round trip (hotClaims), or key → readHeld, readFree or readMissing
	release sqldb.Stmt // key, token
	extend  sqldb.Stmt // key, token, lease µs; nil without a lease column
}

// What MySQL's read of a hot key answers (the last also a claim's answer
// for no row).
const (
	readHeld    = 0
	readFree    = 1 // free, or its lease has passed
	readMissing = 2 // no row
)

// prepare prepares p's statements on d, or closes what it prepared and
// fails.
func (p plan) prepare(ctx context.Context, d sqldb.DB) (*prepared, error) {
	var claim, exists, lockedExists, hot, release, extend sqldb.Stmt
	for _, s := range []struct {
		dst   *sqldb.Stmt
		query string
	}{{&claim, p.claim}, {&exists, p.exists}, {&lockedExists, p.lockedExists}, {&hot, p.hot}, {&release, p.release}, {&extend, p.extend}} {
		if s.query == "" {
			continue
		}
		var err error
		if *s.dst, err = d.Prepare(ctx, s.query); err != nil {
			closeAll(claim, exists, lockedExists, hot, release, extend)
			return nil, err
		}
	}
	st := &prepared{
		claim: probedClaim{claim: inOrder(claim, p.claimOrder), exists: exists, lockedExists: lockedExists,
			onTx: d.Tx() != nil, won: p.won, unsure: p.unsure},
		hot:     scannedCount{hot},
		release: release,
	}
	if p.hotClaims {
		// Its count is the answer: no row for a claim made, one for a key
		// held, two for a row missing or one it cannot tell.
		st.hot = probedClaim{claim: inOrder(hot, p.claimOrder), exists: exists, won: 0, unsure: 2, borrowsExists: true}
	}
	if extend != nil {
		st.extend = inOrder(extend, p.extendOrder)
	}
	return st, nil
}

func (st *prepared) close() error {
	var errs []error
	for _, s := range []sqldb.Stmt{st.claim, st.hot, st.release, st.extend} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// statements returns the claimer's statements, preparing them first at its
// first call: under ctx, watched as a statement is (txn.Watch), once. It
// does not look at Close: a release Close waits for runs after it.
func (c *Claimer) statements(ctx context.Context) (*prepared, error) {
	if st := c.stmts.Load(); st != nil {
		return st, nil
	}
	if err := c.prep.Pass(ctx, "atomic: prepare claimer on "+c.table, c.prepare, final); err != nil {
		return nil, err
	}
	return c.stmts.Load(), nil
}

// final reports whether a preparation's error holds for every caller, who
// then takes it rather than prepare again.
func final(err error) bool {
	return errors.Is(err, contend.ErrInvalid) || errors.Is(err, contend.ErrClosed)
}

// prepare prepares the claimer's statements into c.stmts. The preparation
// is watched: on a driver that does not end it with ctx (lib/pq), a silent
// network would otherwise hold the call past ctx, so it is left to finish
// alone, and closes what it prepared once it does.
func (c *Claimer) prepare(ctx context.Context) error {
	var (
		mu        sync.Mutex
		abandoned bool      // protected by mu
		got       *prepared // protected by mu
	)
	err := txn.Watch(ctx, c.db, func() error {
		st, err := c.plan.prepare(ctx, c.db)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			_ = st.close()
			return nil
		}
		got = st
		return nil
	})
	mu.Lock()
	abandoned, st := true, got
	mu.Unlock()
	if err != nil {
		if st != nil {
			_ = st.close()
		}
		return fmt.Errorf("atomic: prepare claimer on %s: %w", c.table, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		_ = st.close()
		return c.closedErr()
	}
	c.stmts.Store(st)
	return nil
}

// Close waits for the releases of claims whose outcome was unknown (see
// [Claimer.Claim]), each at most [ClaimerConfig.FinishTimeout], then closes
// the prepared statements. When ctx ends first, Close returns an error
// matching ctx's: while releases are under way it leaves the statements
// open, as they need them, for a later Close to close; a statement given
// up on that still runs (lib/pq on a silent network) keeps its statement
// open until it returns, and it is then closed. Close does not wait for calls
// under way: call it once they returned. Calls after Close return an error
// matching [contend.ErrClosed]. Close may be called more than once.
func (c *Claimer) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed.Store(true)
	c.mu.Unlock()
	if err := c.unsure.Wait(ctx); err != nil {
		return fmt.Errorf("atomic: close claimer on %s: releases of claims whose outcome was unknown: %w", c.table, err)
	}
	if err := c.holds.Wait(ctx); err != nil {
		return fmt.Errorf("atomic: close claimer on %s: %w", c.table, err)
	}
	c.mu.Lock()
	st := c.stmts.Load()
	if st == nil || c.stmtsClosed {
		c.mu.Unlock()
		return nil
	}
	c.stmtsClosed = true
	c.mu.Unlock()
	// database/sql closes a statement once no call runs on it: one given
	// up on (lib/pq on a silent network) may run until its connection
	// breaks. So the closing is watched as a statement is, and left to
	// finish alone when ctx ends.
	if err := txn.Watch(ctx, c.db, st.close); err != nil {
		return fmt.Errorf("atomic: close claimer on %s: %w", c.table, err)
	}
	return nil
}

// closedErr is the error of a call after Close.
func (c *Claimer) closedErr() error {
	return fmt.Errorf("atomic: claimer on %s: %w", c.table, contend.ErrClosed)
}

// Claim claims key with a fresh random token and returns the token, which the
// holder passes to [Claimer.Release] and may hand to whatever it starts (the
// token is known before the work begins, so the work can carry it). It returns
// an error matching [contend.ErrConflict] when key is already claimed and
// [contend.ErrNotFound] when key has no row.
//
// When Claim cannot tell whether its claim was made (ctx ended, or the
// connection broke, after the statement was sent: the server may have
// applied it and the answer been lost), it returns an error that says so,
// and releases its token itself, in the background, within
// [ClaimerConfig.FinishTimeout] (Close waits for it): a release clears only
// the claim of that token, so it is safe whether or not the claim was made.
// Only if that release fails too, or the claim's statement reaches the
// server after it (a network that delayed it rather than lost it), may the
// key stay claimed: until the lease passes, or without a lease column until
// cleared. In a transaction the
// claim is the transaction's, and ends with it instead.
func (c *Claimer) Claim(ctx context.Context, key string) (token string, err error) {
	t := newToken()
	if err := c.ClaimAs(ctx, key, t); err != nil {
		return "", err
	}
	return t, nil
}

var newToken = token.New

// ClaimAs is [Claimer.Claim] with a token of the caller's, such as the id of
// the engine it is about to start. Tokens must be unique per claim: a release
// with a token compares only the token.
func (c *Claimer) ClaimAs(ctx context.Context, key, token string) error {
	if err := checkKey("claim", key); err != nil {
		return err
	}
	if c.closed.Load() {
		return c.closedErr()
	}
	if token == "" {
		return fmt.Errorf("atomic: claim %q: empty token: %w", key, contend.ErrInvalid)
	}
	if c.observer == nil {
		return c.claimRow(ctx, key, token)
	}
	began := time.Now()
	err := c.claimRow(ctx, key, token)
	claimed := c.reportClaim(ctx, key, began, err)
	if err == nil {
		c.tracked.made(key, token, claimed, claimed.Sub(began))
	}
	return err
}

// claimRow makes the claim of ClaimAs, reporting nothing.
func (c *Claimer) claimRow(ctx context.Context, key, token string) error {
	if err := ctxerr.Of(ctx); err != nil {
		// Nothing sent, so nothing to release.
		return fmt.Errorf("atomic: claim %q: %w", key, err)
	}
	if _, err := c.statements(ctx); err != nil {
		return err
	}
	tx, err := c.tx(ctx)
	if err != nil {
		return fmt.Errorf("atomic: claim %q: %w", key, err)
	}
	// Only claims outside a transaction are counted, and shared: in one,
	// a concurrent claim waits for the other transaction rather than
	// losing, a read could see the transaction's snapshot rather than the
	// row, and a claim must be the transaction's own.
	losses := c.losses
	if tx != nil {
		losses = nil
	}
	if losses != nil && losses.Hot(key) {
		// Most claims of this key lose. The claims of this Claimer that
		// want it at once share one statement, which began after each of
		// them did (share), so the others sleep instead of each sending
		// one, and its answer was true within each one's call.
		n, sent, err := c.hot.Do(ctx, key, token)
		claims := c.plan.hotClaims // the statement shared is the claim itself
		switch {
		case claims && sent:
			return c.claimed(ctx, key, token, losses, n, err)
		case err != nil:
			return fmt.Errorf("atomic: claim %q: %w", key, err)
		case n == readMissing: // the claim's count for no row too
			return fmt.Errorf("atomic: claim %q: %w", key, contend.ErrNotFound)
		case claims, n == readHeld:
			// Held by the claim another caller sent, which won, or by the
			// holder it lost to; or held as the read ran.
			losses.Record(key, 1, 1)
			return &heldError{key}
		}
		// The read found the key free: claim it, as any key.
	}
	n, err := c.claimStatement(ctx, tx, key, token)
	return c.claimed(ctx, key, token, losses, n, err)
}

// claimStatement runs the claim's statement, in tx when not nil: its
// count is 0 for a claim made, 1 for a key held, 2 for no row.
func (c *Claimer) claimStatement(ctx context.Context, tx sqldb.Tx, key, token string) (int64, error) {
	return c.exec(ctx, tx, c.stmts.Load().claim, c.claimArgs(), key, token)
}

// claimArgs is how many of the claimer's arguments a claim takes.
func (c *Claimer) claimArgs() int {
	if c.lease > 0 {
		return 3
	}
	return 2
}

// claimed is the outcome of a claim whose statement answered n, err.
func (c *Claimer) claimed(ctx context.Context, key, token string, losses *keyrate.Table, n int64, err error) error {
	switch {
	case err != nil && c.mayHaveClaimed(ctx, err):
		return c.releaseUnknown(ctx, key, token, err)
	case err != nil:
		return fmt.Errorf("atomic: claim %q: %w", key, err)
	case n == 2:
		return fmt.Errorf("atomic: claim %q: %w", key, contend.ErrNotFound)
	}
	if losses != nil {
		losses.Record(key, 1, int(n))
	}
	if n == 0 {
		return nil
	}
	return &heldError{key}
}

// hotStatement is the statement the claims of a hot key share, outside any
// transaction (claimRow): on PostgreSQL the claim itself, with the token of
// the claim that sends it; on MySQL a read, which answers readHeld,
// readFree or readMissing. Its claims prepared the statements first.
func (c *Claimer) hotStatement(ctx context.Context, key, token string) (int64, error) {
	if c.plan.hotClaims {
		return c.exec(ctx, nil, c.stmts.Load().hot, c.claimArgs(), key, token)
	}
	return c.exec(ctx, nil, c.stmts.Load().hot, 1, key, "")
}

// mayHaveClaimed reports whether a claim statement that failed with err
// may have been applied all the same, and committed: it ran outside any
// transaction, and the error is not the server's answer (nor a refusal
// before anything was sent).
func (c *Claimer) mayHaveClaimed(ctx context.Context, err error) bool {
	if sqlerr.FromServer(err) || errors.Is(err, contend.ErrInvalid) {
		return false
	}
	tx, terr := c.tx(ctx)
	return tx == nil && terr == nil && !c.onTx
}

// releaseUnknown releases the claim of key with token, which may or may
// not have been made (the claim failed with err), on a goroutine that Close
// waits for, and returns the error the claim reports. The release runs at
// once: the caller has given up, and a claim made unheard would otherwise
// hold key for nobody.
func (c *Claimer) releaseUnknown(ctx context.Context, key, token string, err error) error {
	c.unsure.Go(func() {
		released, rerr := c.releaseAfter(ctx, key, token)
		switch {
		case c.observer == nil:
		case rerr != nil:
			c.reportFailed(ctx, key, rerr)
		case released:
			c.reportEnd(ctx, key, held{}, nil, nil, nil)
		}
	})
	until := "until its owner column is cleared"
	if c.lease > 0 {
		until = "until its lease passes, at the latest " + time.Now().Add(c.lease).Format(time.RFC3339Nano)
	}
	return fmt.Errorf("atomic: claim %q: the outcome is unknown, so the claim, if made, is being released "+
		"(within %v; should the release fail, or the claim land after it, the key may stay claimed %s): %w", key, c.finish, until, err)
}

// heldError is a claim's lost race: "atomic: claim <key>: <ErrConflict>",
// matching [contend.ErrConflict]. On a hot key it is the common answer, so
// it is one allocation, formatted only when read.
type heldError struct{ key string }

func (e *heldError) Error() string {
	return fmt.Sprintf("atomic: claim %q: %v", e.key, contend.ErrConflict)
}

func (e *heldError) Unwrap() error { return contend.ErrConflict }

// Release clears key's claim if, and only if, it is still held with token. It
// reports whether it cleared it: false means the claim had already been
// released, or had expired and been taken over, and the newer claim stays.
func (c *Claimer) Release(ctx context.Context, key, token string) (released bool, err error) {
	if err := checkKey("release", key); err != nil {
		return false, err
	}
	if c.closed.Load() {
		return false, c.closedErr()
	}
	released, err = c.releaseRow(ctx, key, token)
	if c.observer != nil {
		if err != nil {
			c.reportFailed(ctx, key, err)
			return false, err
		}
		var lost error
		if !released {
			lost = gone(key)
		}
		h := c.tracked.get(key, token, true)
		c.reportEnd(ctx, key, h, nil, lost, nil)
	}
	return released, err
}

// releaseRow is Release, reporting nothing.
func (c *Claimer) releaseRow(ctx context.Context, key, token string) (released bool, err error) {
	st, err := c.statements(ctx)
	if err == nil {
		released, err = c.applied(ctx, st.release, key, token, false)
	}
	if err != nil {
		return false, fmt.Errorf("atomic: release %q: %w", key, err)
	}
	return released, nil
}

// Extend pushes the lease of key's claim to Lease from now, if it is still
// held with token and has not expired. It reports whether it did; a claimer
// without a lease column reports an error matching [contend.ErrInvalid].
func (c *Claimer) Extend(ctx context.Context, key, token string) (extended bool, err error) {
	if err := checkKey("extend", key); err != nil {
		return false, err
	}
	if c.closed.Load() {
		return false, c.closedErr()
	}
	if c.lease == 0 {
		return false, fmt.Errorf("atomic: extend %q: claimer has no lease column: %w", key, contend.ErrInvalid)
	}
	extended, err = c.extendRow(ctx, key, token)
	switch {
	case c.observer == nil:
	case err != nil:
		c.reportFailed(ctx, key, err)
	case !extended:
		c.reportEnd(ctx, key, c.tracked.get(key, token, false), nil, gone(key), nil)
	}
	return extended, err
}

// extendRow is Extend, reporting nothing.
func (c *Claimer) extendRow(ctx context.Context, key, token string) (extended bool, err error) {
	st, err := c.statements(ctx)
	if err == nil {
		extended, err = c.applied(ctx, st.extend, key, token, true)
	}
	if err != nil {
		return false, fmt.Errorf("atomic: extend %q: %w", key, err)
	}
	return extended, nil
}

// Do claims key, runs fn, and releases the claim, also when fn returns an error
// or panics (the panic is re-raised after the release). It returns fn's error,
// or an error matching [contend.ErrConflict] without running fn when key is
// held, or the claim's error without running fn when it was not made or
// may not have been (then released as [Claimer.Claim] says). With a lease column the lease is extended while fn runs; if it is lost
// (taken over after an extension failed, or cleared by hand), fn's ctx is
// cancelled with cause [contend.ErrLockLost] and Do's error matches it too.
//
// The release waits for the server's answer at most
// [ClaimerConfig.FinishTimeout], even after ctx has ended.
//
// Inside a transaction (the Claimer was built on one, or ctx carries a SQL
// guard's), the claim, fn and the release all run in it: the claim is the
// transaction's row lock until it ends, so it needs no lease extension, and
// a concurrent claim of the key in another transaction waits for that one to
// end rather than failing at once. Others see the claim only if the
// transaction commits, which after the release leaves the key free.
func (c *Claimer) Do(ctx context.Context, key string, fn func(ctx context.Context) error) (err error) {
	if err := checkKey("do", key); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("atomic: do %q: nil fn: %w", key, contend.ErrInvalid)
	}
	if c.closed.Load() {
		return c.closedErr()
	}
	outer, err := c.db.Outer(ctx)
	if err != nil {
		return fmt.Errorf("atomic: do %q: %w", key, err)
	}
	inTx := c.onTx || outer != nil
	tok := newToken()
	began := time.Now()
	err = c.claimRow(ctx, key, tok)
	var h held
	if c.observer != nil {
		h.at = c.reportClaim(ctx, key, began, err)
		h.wait = h.at.Sub(began)
	}
	if err != nil {
		return err
	}
	if inTx {
		return c.doInTx(ctx, key, tok, h, fn)
	}
	runCtx := ctx
	var hold *keepalive.Hold
	if c.lease > 0 {
		hold = c.holds.Start(ctx, began, c.lease, func(ctx context.Context) (bool, error) {
			extended, err := c.extendRow(ctx, key, tok)
			if err != nil && c.observer != nil {
				c.reportFailed(ctx, key, err)
			}
			return extended, err
		})
		runCtx = hold.Context()
	}
	defer func() {
		fnErr := err
		var lost error
		if hold != nil {
			lost = hold.Stop()
		}
		released, rerr := c.releaseAfter(ctx, key, tok)
		switch {
		case rerr != nil:
			err = errors.Join(err, rerr)
		case !released && lost == nil:
			lost = fmt.Errorf("atomic: claim %q was gone when fn returned: %w", key, contend.ErrLockLost)
		}
		if lost != nil {
			err = errors.Join(lost, err)
		}
		if c.observer != nil {
			c.reportEnd(ctx, key, h, rerr, lost, fnErr)
		}
	}()
	return fn(runCtx)
}

// doInTx runs fn and releases in the transaction that made the claim. The
// release runs even when fn failed or panicked, so that a caller who goes on
// with the transaction does not commit a claim nobody holds.
func (c *Claimer) doInTx(ctx context.Context, key, tok string, h held, fn func(ctx context.Context) error) (err error) {
	defer func() {
		fnErr := err
		released, rerr := c.releaseRow(ctx, key, tok)
		var lost error
		switch {
		case rerr != nil:
			err = errors.Join(err, rerr)
		case !released:
			lost = fmt.Errorf("atomic: claim %q was gone when fn returned: %w", key, contend.ErrLockLost)
			err = errors.Join(lost, err)
		}
		if c.observer != nil {
			c.reportEnd(ctx, key, h, rerr, lost, fnErr)
		}
	}()
	return fn(ctx)
}

// releaseAfter releases key's claim after fn, on a context of its own (the
// caller may have given up, which may be why fn returned, but the claim must
// still be released, or the key stays blocked) and within c.finish, kept by
// a timer: a driver that does not watch ctx while the network is silent
// (lib/pq) would otherwise hold Do until the kernel gives up.
func (c *Claimer) releaseAfter(ctx context.Context, key, tok string) (released bool, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.finish)
	defer cancel()
	// The answer travels as the error only: a release given up on still
	// finishes, and must write nothing Do reads.
	err = txn.Within("atomic: release "+strconv.Quote(key), c.finish, func() error {
		released, err := c.releaseRow(rctx, key, tok)
		if err == nil && !released {
			return errNotReleased
		}
		return err
	}, cancel)
	if err == errNotReleased {
		return false, nil
	}
	return err == nil, err
}

// errNotReleased is a release that found the claim gone.
var errNotReleased = errors.New("atomic: claim not released")

func checkKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("atomic: %s: empty key: %w", op, contend.ErrInvalid)
	}
	return nil
}

// tx returns the transaction the claimer's statements run in for ctx: the
// one ctx carries (fn of a SQL guard) when the claimer is on a pool, so
// that a claim inside a guard's fn never waits for a row lock its own
// goroutine holds; nil when they run where they were prepared (the pool, or
// the transaction the claimer was built on).
func (c *Claimer) tx(ctx context.Context) (sqldb.Tx, error) {
	if c.onTx {
		return nil, nil
	}
	return c.db.Outer(ctx)
}

func (c *Claimer) applied(ctx context.Context, s sqldb.Stmt, key, token string, lease bool) (bool, error) {
	n, err := c.run(ctx, s, key, token, lease)
	return n == 1, err
}

// run runs s with key, token and, when lease is set, the lease in
// microseconds, watched (txn.WatchStmt), in the transaction ctx carries if
// any, and returns the count of rows it reports.
func (c *Claimer) run(ctx context.Context, s sqldb.Stmt, key, token string, lease bool) (int64, error) {
	tx, err := c.tx(ctx)
	if err != nil {
		return 0, err
	}
	args := 2
	if lease {
		args = 3
	}
	return c.exec(ctx, tx, s, args, key, token)
}

// exec runs s in tx (nil: where it was prepared) with the first args of
// key, token and the lease in microseconds, watched (txn.WatchStmt), and
// returns the count of rows it reports.
func (c *Claimer) exec(ctx context.Context, tx sqldb.Tx, s sqldb.Stmt, args int, key, token string) (int64, error) {
	// The arguments go through an interface, where a slice of them would
	// escape: one allocation per statement that the bare statement does
	// not make. So their array is reused, once the statement is done with
	// it (a statement given up on may still read it).
	a := argArrays.Get().(*[3]any)
	a[0], a[1] = key, token
	if args > 2 {
		a[2] = c.lease.Microseconds()
	}
	n, err := txn.WatchStmt(ctx, s, tx, a[:args])
	if !errors.Is(err, txn.ErrNoAnswer) {
		*a = [3]any{}
		argArrays.Put(a)
	}
	return n, err
}

var argArrays = sync.Pool{New: func() any { return new([3]any) }}

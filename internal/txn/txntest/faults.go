package txntest

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/subtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn"
)

// Table is the table every subject works on: one row per key, with a counter
// fn adds to, a version for the optimistic guard, and owner and lease
// columns for the claimer. Its rows exist before the faults strike.
const Table = "fault_items"

const schemaSQL = `CREATE TABLE ` + Table + ` (
	id text PRIMARY KEY,
	n int NOT NULL DEFAULT 0,
	version bigint NOT NULL DEFAULT 0,
	owner text,
	lease timestamptz)`

// Fn is the guarded work: it adds 1 to key's n through q, when the guard
// hands it a querier (nil when the guard writes itself, as a Store does),
// then lets the fault strike.
type Fn func(ctx context.Context, q sqldb.Querier) error

// Op runs the subject once for key with fn as its work. A subject with a
// function to run calls fn inside it; a single statement (atomic.Update)
// calls fn(ctx, nil) first and then runs the statement that adds 1 itself.
type Op func(ctx context.Context, key string, fn Fn) error

// A Subject is one SQL guard put through the faults.
type Subject struct {
	// New builds the guard on db, with finish as its FinishTimeout.
	New func(t testing.TB, db contend.DB, finish time.Duration) Op
	// Transactional says fn's writes commit or roll back with the guard
	// (all but the claimer, whose fn writes straight to the pool).
	Transactional bool
	// Lease is the claimer's lease: a claim whose release was lost holds
	// that long. Zero for the others.
	Lease time.Duration
}

// Bounds of the faults: ctx's deadline, the subjects' finish bound, and the
// slack allowed for scheduling on a loaded machine. A call returns within
// Deadline + txn.CancelGrace + Finish: a statement the network swallowed is
// given up CancelGrace after ctx's end, and the rollback after it Finish.
const (
	Deadline = 800 * time.Millisecond
	Finish   = 400 * time.Millisecond
	Slack    = 400 * time.Millisecond
	Bound    = Deadline + txn.CancelGrace + Finish
)

// statements are what the fault cases say to a server, in its dialect.
type statements struct {
	schema, insert, increment, count string
	// free reports whether nothing holds key (see [Free]).
	free func(ctx context.Context, direct *sqlx.DB, key string) (bool, error)
}

var postgres = statements{
	schema:    schemaSQL,
	insert:    `INSERT INTO ` + Table + ` (id) VALUES ($1)`,
	increment: `UPDATE ` + Table + ` SET n = n + 1 WHERE id = $1`,
	count:     `SELECT n FROM ` + Table + ` WHERE id = $1`,
	free:      Free,
}

// mariaDB's lease is a DATETIME(6) holding UTC, as atomic's claim on MySQL
// keeps it.
var mariaDB = statements{
	schema: `CREATE TABLE ` + Table + ` (
	id varchar(191) PRIMARY KEY,
	n int NOT NULL DEFAULT 0,
	version bigint NOT NULL DEFAULT 0,
	owner varchar(191),
	lease datetime(6))`,
	insert:    `INSERT INTO ` + Table + ` (id) VALUES (?)`,
	increment: `UPDATE ` + Table + ` SET n = n + 1 WHERE id = ?`,
	count:     `SELECT n FROM ` + Table + ` WHERE id = ?`,
	free:      FreeOnMariaDB,
}

func statementsOf(driver string) statements {
	if testserver.Dialect(driver) == sqldb.MySQL {
		return mariaDB
	}
	return postgres
}

func (st statements) add(ctx context.Context, q sqldb.Querier, key string) error {
	_, err := q.Exec(ctx, st.increment, key)
	return err
}

// scene is one fault test's world: a fresh schema with key's row, a pool
// straight to the server and the subject built on a pool through a proxy.
type scene struct {
	direct *sqlx.DB
	proxy  *faultproxy.Proxy
	op     Op
	key    string
	sql    statements
}

// newRow creates Table if need be and a row in it, and returns its key:
// one of its own per test, since advisory locks are the whole database's.
func newRow(t *testing.T, direct *sqlx.DB, st statements) string {
	t.Helper()
	key := testserver.RandomName("k-")
	_, err := direct.Exec(strings.Replace(st.schema, "CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
	require.NoError(t, err)
	_, err = direct.Exec(st.insert, key)
	require.NoError(t, err)
	return key
}

// addThen is the fn of the fault cases: it adds 1 to key's n through q (when
// the guard hands it one), then lets fault strike.
func addThen(st statements, key string, fault func(ctx context.Context, q sqldb.Querier) error) Fn {
	return func(ctx context.Context, q sqldb.Querier) error {
		if q != nil {
			if err := st.add(ctx, q, key); err != nil {
				return err
			}
		}
		return fault(ctx, q)
	}
}

func newScene(t *testing.T, s Subject, driver string) scene {
	t.Helper()
	url := testserver.URL(t, driver)
	direct := testserver.Open(t, driver, url)
	st := statementsOf(driver)
	key := newRow(t, direct, st)
	proxy, proxied := Proxied(t, url)
	sc := scene{direct: direct, proxy: proxy, op: s.New(t, testserver.Handle(t, driver, proxied), Finish), key: key, sql: st}
	// Before the subject's own cleanup: a statement still waiting on a
	// silent connection would hold it (closing a prepared statement waits).
	// Healed first, so that what the driver sends on a new connection as
	// it lets go is not swallowed: pgx closes a connection that a ctx cut
	// short after a cancel request, waiting up to 15s for it.
	t.Cleanup(func() {
		proxy.Heal()
		proxy.Reset()
	})
	return sc
}

// Run puts s through every fault, under every driver, each in a subtest:
//
//   - network: a connection reset mid-transaction, silence during the
//     commit, silence from the call's start, added latency (through a
//     fault proxy);
//   - process: the holder's process SIGKILLed inside fn, or SIGSTOPped past
//     its ctx's deadline and resumed (the test binary runs as the holder);
//   - restart: the server restarted mid-transaction (a server of the test's
//     own).
//
// Each checks what the caller sees, that the call returns within its bound,
// that nothing is half-written and that nothing stays held. The cases
// spend their time waiting on timers (ctx deadlines, the server's idle
// timeout, a stopped process), not on a CPU: the three run at once
// ([subtest.Together]), and so do the drivers of network and process, each
// with a row and a proxy of its own; the cases of one driver run one after
// the other, to keep the connections to the shared server few. The
// restarts share one server, so their drivers take turns. Run it from a
// top-level test that does nothing else: in the holder process, Run plays
// the holder. That test may be a parallel one: Run keeps about 13
// connections to the shared server at most.
func Run(t *testing.T, s Subject) {
	if orders := os.Getenv(holderEnv); orders != "" {
		hold(t, s, orders)
		return
	}
	perDriver := func(f func(t *testing.T, driver string)) func(t *testing.T) {
		return func(t *testing.T) {
			var drivers []subtest.Test
			for _, driver := range testserver.AllDrivers {
				drivers = append(drivers, subtest.Test{Name: driver, F: func(t *testing.T) { f(t, driver) }})
			}
			subtest.Together(t, drivers...)
		}
	}
	subtest.Together(t,
		subtest.Test{Name: "network", F: perDriver(func(t *testing.T, driver string) {
			for _, c := range networkCases(s, driver) {
				t.Run(c.Name, c.F)
			}
		})},
		subtest.Test{Name: "process", F: perDriver(func(t *testing.T, driver string) {
			t.Run("holder killed", func(t *testing.T) { killed(t, s, driver) })
			t.Run("holder stopped", func(t *testing.T) { stopped(t, s, driver) })
		})},
		subtest.Test{Name: "restart", F: func(t *testing.T) {
			pg := testserver.OwnPostgres(t)
			for _, driver := range testserver.AllDrivers {
				t.Run(driver, func(t *testing.T) { restarted(t, s, pg, driver) })
			}
		}},
	)
}

// RunOnMariaDB puts s through the network faults of [Run] on MariaDB
// (testserver.MariaDBDriver, a pool wrapped by mysqldb.Wrap), through a
// fault proxy in front of the server, checking the same promises. The
// process and restart faults are run on PostgreSQL only: they say nothing
// of the dialect, and the MariaDB server is shared. With one driver, its
// cases run at once, each with a database and a proxy of its own: about
// as many connections as Run's network drivers keep.
func RunOnMariaDB(t *testing.T, s Subject) {
	subtest.Together(t, networkCases(s, testserver.MariaDBDriver)...)
}

// networkCases are the network faults under driver.
func networkCases(s Subject, driver string) []subtest.Test {
	return []subtest.Test{
		{Name: "reset mid-transaction", F: func(t *testing.T) { reset(t, s, driver) }},
		{Name: "silence during commit", F: func(t *testing.T) { silence(t, s, driver) }},
		{Name: "silence from the start", F: func(t *testing.T) { silentStart(t, s, driver) }},
		{Name: "latency", F: func(t *testing.T) { latency(t, s, driver) }},
	}
}

// outcome is what one Op did.
type outcome struct {
	err  error
	took time.Duration
	// fnLate is how long after ctx's deadline fn returned, when it did:
	// fn is the caller's code (here, statements of the test's own driver,
	// which end with ctx only when the server answers the cancel), and no
	// guard can return before the fn it runs does.
	fnLate time.Duration
}

// requireWithin fails t when the Op took longer than bound (plus Slack) and
// what fn itself overran.
func (o outcome) requireWithin(t *testing.T, bound time.Duration) {
	t.Helper()
	require.Less(t, o.took, bound+Slack+o.fnLate, "fn returned %v past ctx's deadline", o.fnLate)
}

// run runs op on a goroutine and fails t when it outlives limit: a guard
// that waits on the network past its bounds would otherwise hang the test.
func run(t *testing.T, ctx context.Context, sc scene, fn Fn, limit time.Duration) outcome {
	t.Helper()
	start := time.Now()
	deadline, _ := ctx.Deadline()
	var fnEnd atomic.Int64
	timed := func(ctx context.Context, q sqldb.Querier) error {
		defer func() { fnEnd.Store(time.Now().UnixNano()) }()
		return fn(ctx, q)
	}
	done := make(chan error, 1)
	go func() { done <- sc.op(ctx, sc.key, timed) }()
	select {
	case err := <-done:
		o := outcome{err: err, took: time.Since(start)}
		if end := fnEnd.Load(); end != 0 {
			o.fnLate = max(0, time.Unix(0, end).Sub(deadline))
		}
		return o
	case <-time.After(limit + 5*time.Second):
		t.Fatalf("still running %v after it began, past its bound of %v", time.Since(start), limit)
		return outcome{}
	}
}

func count(t *testing.T, sc scene) int {
	t.Helper()
	var n int
	require.NoError(t, sc.direct.Get(&n, sc.sql.count, sc.key))
	return n
}

// Free reports whether nothing holds key: its row can be locked at once, its
// advisory key taken at once, and it is not claimed (or its lease passed).
func Free(ctx context.Context, direct *sqlx.DB, key string) (bool, error) {
	tx, err := direct.BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = 1`); err != nil {
		return false, err
	}
	var unclaimed bool
	if err := tx.GetContext(ctx, &unclaimed, `SELECT owner IS NULL OR lease < now() FROM `+Table+` WHERE id = $1 FOR UPDATE NOWAIT`, key); err != nil {
		return false, nil // held (55P03)
	}
	var advisory bool
	if err := tx.GetContext(ctx, &advisory, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
		return false, err
	}
	return unclaimed && advisory, nil
}

// FreeOnMariaDB is [Free] on MariaDB, where the advisory lock is GET_LOCK's
// on CONCAT('contend:', SHA2(key, 224)), as pessimistic's guard names it.
func FreeOnMariaDB(ctx context.Context, direct *sqlx.DB, key string) (bool, error) {
	tx, err := direct.BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var unclaimed bool
	if err := tx.GetContext(ctx, &unclaimed, `SELECT owner IS NULL OR lease < UTC_TIMESTAMP(6) FROM `+Table+` WHERE id = ? FOR UPDATE NOWAIT`, key); err != nil {
		return false, nil // held (1205)
	}
	var advisory bool
	if err := tx.GetContext(ctx, &advisory, `SELECT IS_FREE_LOCK(CONCAT('contend:', SHA2(?, 224)))`, key); err != nil {
		return false, err
	}
	return unclaimed && advisory, nil
}

// requireFreeWithin fails t unless key is free within d.
func requireFreeWithin(t *testing.T, sc scene, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool {
		free, err := sc.sql.free(t.Context(), sc.direct, sc.key)
		return err == nil && free
	}, d, 10*time.Millisecond, "still held %v after the fault", d)
	return time.Since(start)
}

// nextStatement is fn's statement after a fault, which meets it; without a
// querier, the guard's own next statement does.
func nextStatement(ctx context.Context, q sqldb.Querier) error {
	if q == nil {
		return nil
	}
	_, err := q.Exec(ctx, `SELECT 1`)
	return err
}

// The connection breaks (RST) after fn's write, and fn's next statement
// meets the broken connection. The server sees the close at once: it rolls
// back and lets go.
func reset(t *testing.T, s Subject, driver string) {
	sc := newScene(t, s, driver)

	ctx, cancel := context.WithTimeout(t.Context(), Deadline)
	defer cancel()
	o := run(t, ctx, sc, addThen(sc.sql, sc.key, func(ctx context.Context, q sqldb.Querier) error {
		sc.proxy.Reset()
		return nextStatement(ctx, q)
	}), Bound)
	t.Logf("%s: Do returned after %v (fn %v late): %v", driver, o.took, o.fnLate, o.err)
	o.requireWithin(t, Bound)
	freeAfter := requireFreeWithin(t, sc, time.Second)
	n := count(t, sc)
	switch {
	case o.err == nil:
		require.Equal(t, 1, n, "Do succeeded: the write is there")
	case s.Transactional:
		require.Zero(t, n, "Do failed: nothing of fn's transaction is there")
	}
	t.Logf("%s: n = %d, free %v after Do returned", driver, n, freeAfter)
}

// The network goes silent (no reply, no reset) once fn has written: the
// commit, or the claimer's release, gets no answer. Do returns by ctx's
// deadline plus the finish bound, with an error matching
// context.DeadlineExceeded; the server never got the COMMIT, so nothing of
// fn's transaction is applied, and the locks go once the server ends the
// silent session (its idle_in_transaction_session_timeout).
func silence(t *testing.T, s Subject, driver string) {
	sc := newScene(t, s, driver)

	ctx, cancel := context.WithTimeout(t.Context(), Deadline)
	defer cancel()
	o := run(t, ctx, sc, addThen(sc.sql, sc.key, func(context.Context, sqldb.Querier) error {
		sc.proxy.Blackhole()
		return nil
	}), Bound)
	t.Logf("%s: Do returned after %v: %v", driver, o.took, o.err)
	require.ErrorIs(t, o.err, context.DeadlineExceeded)
	o.requireWithin(t, Bound)
	freeAfter := requireFreeWithin(t, sc, IdleInTransaction+s.Lease+2*time.Second)
	n := count(t, sc)
	if s.Transactional {
		require.Zero(t, n, "a commit the server never got was applied")
	}
	t.Logf("%s: n = %d, free %v after Do returned", driver, n, freeAfter)
}

// The network is silent before the call begins: its first statement (BEGIN,
// the claim, a Store's read, the update) gets no answer. The call returns
// ctx's error within its bound, having done nothing.
func silentStart(t *testing.T, s Subject, driver string) {
	sc := newScene(t, s, driver)
	sc.proxy.Blackhole()

	ctx, cancel := context.WithTimeout(t.Context(), Deadline)
	defer cancel()
	o := run(t, ctx, sc, addThen(sc.sql, sc.key, func(context.Context, sqldb.Querier) error { return nil }), Bound)
	t.Logf("%s: Do returned after %v: %v", driver, o.took, o.err)
	require.ErrorIs(t, o.err, context.DeadlineExceeded)
	o.requireWithin(t, Bound)
	require.Zero(t, count(t, sc), "nothing reached the server")
	requireFreeWithin(t, sc, time.Second)
}

// Every exchange takes 20ms longer each way: Do succeeds, slower.
func latency(t *testing.T, s Subject, driver string) {
	sc := newScene(t, s, driver)
	sc.proxy.SetLatency(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	o := run(t, ctx, sc, func(ctx context.Context, q sqldb.Querier) error {
		if q != nil {
			return sc.sql.add(ctx, q, sc.key)
		}
		return nil
	}, 5*time.Second)
	t.Logf("%s: Do returned after %v: %v", driver, o.took, o.err)
	require.NoError(t, o.err)
	require.Equal(t, 1, count(t, sc))
	requireFreeWithin(t, sc, time.Second)
}

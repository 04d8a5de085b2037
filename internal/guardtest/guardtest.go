// Package guardtest is the conformance suite of [contend.Guard]: one function,
// [Run], that checks the whole contract against any guard, so that every
// strategy gets it checked the same way.
//
// The contract, as checked here:
//   - no lost update: goroutines in several processes do a read-modify-write of
//     a counter row inside Do, through [contend.Querier]; the counter ends equal
//     to the number of calls that succeeded;
//   - for lock-based guards, no two fns for one key are ever inside at once,
//     across processes (an overlap counter in Redis, outside any transaction);
//   - fn's error is returned unchanged (errors.Is), and fn's panic re-raised;
//   - a lost race gives [contend.ErrConflict] at once where the guard fails
//     fast, and waits for ctx otherwise;
//   - ctx cancelled before or during fn, and a panic in fn, leave nothing held;
//   - an empty key is refused with [contend.ErrInvalid];
//   - a careless caller that ignores a lost nested lock and goes on writing
//     gets the truth from the outer call: all of its writes or none, and
//     nil means all ([CarelessNesting]);
//   - a SQL guard built on one connection, one server session, rather than
//     a pool is refused with [contend.ErrInvalid];
//   - every history is linearizable: each call's read-modify-write is
//     recorded, in every process, with its call and return times and the
//     value it read, and checked key by key against a counter with
//     porcupine (package internal/history says how, and what a failed call
//     may have done). The contention runs check their histories, and one
//     more run checks a history made under faults: three processes, the
//     first of which talks to PostgreSQL and to Redis through fault proxies
//     that slow its link, lose a reply after its command ran and reset its
//     connections, round after round (a guard for one process runs it in
//     one process). The suite fails if the faults cut no connection.
//
// The run under faults is a few seconds per guard. Set CONTEND_LONG=1 for a
// longer one: twice the goroutines, five times the operations, twice the
// keys.
//
// Goroutines left behind are caught by the calling package's TestMain
// (testserver.Main).
package guardtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/history"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/subtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/waitfor"
)

// Env is what a guard is built on, in whichever process builds it.
type Env struct {
	// DB is a pool, through the suite's driver, on a schema of the test's
	// own, for the test's own statements (under testserver.PgxNative, pgx's
	// stdlib driver).
	DB *sqlx.DB
	// Handle is the pool the guard is built on: DB itself under a
	// database/sql driver, a testserver.Native pool under PgxNative.
	Handle contend.DB
	// Redis is a client of the test server; keys the guard makes must start
	// with Prefix.
	Redis  *redis.Client
	Prefix string
	// Dialect is the SQL of the suite's driver's server.
	Dialect sqldb.Dialect
}

// Suite describes the guard under test.
type Suite struct {
	// Driver is one of testserver.AllDrivers ("postgres", "pgx" or
	// "pgx-native"), or testserver.MariaDBDriver.
	Driver string
	// Setup prepares the backend for keys (tables, rows), once per subtest, in
	// the test process only. Optional.
	Setup func(t testing.TB, env Env, keys []string)
	// New builds the guard, in the test process or in a worker process. The
	// guard is closed, if it has a Close() or Close(ctx) method, when the test
	// ends. Optional when NewOn is set.
	New func(t testing.TB, env Env) contend.Guard
	// NewOn builds the guard as New does, on db instead of env.Handle, and
	// returns the constructor's error. SQL guards set it: the suite builds
	// one on a single connection, which must be refused.
	NewOn func(env Env, db contend.DB) (contend.Guard, error)
	// FailFast is true for guards that answer a held key with ErrConflict at
	// once; the others wait for it until ctx ends.
	FailFast bool
	// Exclusive is true for lock-based guards: no two fns for one key overlap.
	// A guard that is neither exclusive nor fail-fast is optimistic: fns
	// overlap and the loser of a commit runs again.
	Exclusive bool
	// SingleProcess is true for guards that hold within one process only (the
	// in-memory queue). The run across processes then has to show the guard
	// not holding there: a negative control of what its docs say.
	SingleProcess bool
	// Ops is how many calls each goroutine makes in the contention runs.
	// Default: 12, enough for the negative controls (10) to lose updates
	// every run.
	Ops int
}

// counterTable holds the counters fn increments.
const counterTable = "guardtest_counters"

// Run checks s's guard against the whole contract, in subtests. The
// contention runs keep the CPU busy for seconds, one after the other; the
// other checks mostly wait (the lost race of a waiting guard waits a second
// for ctx to end), so they run beside them, one after the other too, each
// with a schema and a pool of its own.
func Run(t *testing.T, s Suite) {
	if s.Ops <= 0 {
		s.Ops = 12
	}
	subtest.Together(t,
		subtest.Test{Name: "contention", F: func(t *testing.T) { underContention(t, s) }},
		subtest.Test{Name: "calls", F: func(t *testing.T) { calls(t, s) }},
	)
}

// underContention checks that the guard keeps its promises under
// contention, from goroutines, from processes, and under faults.
func underContention(t *testing.T, s Suite) {
	t.Run("no_lost_update/goroutines", func(t *testing.T) {
		rep := Contend(t, s, harness.Config{Goroutines: 16, Ops: s.Ops, Keys: keys(3)})
		rep.RequireHeld(t, s)
	})
	t.Run("no_lost_update/processes", func(t *testing.T) {
		rep := Contend(t, s, harness.Config{Processes: 3, Goroutines: 16, Ops: s.Ops, Keys: keys(3)})
		if !s.SingleProcess {
			rep.RequireHeld(t, s)
			return
		}
		// What the guard's docs say: it holds within one process, not across.
		t.Logf("successes %d, counted %d, overlaps %d; history: %v", rep.Successes, rep.Counted, rep.Overlaps, rep.History)
		require.True(t, rep.Counted < int64(rep.Successes) || rep.Overlaps > 0,
			"a single-process guard showed no overlap across processes: the check cannot see what it claims to")
	})
	t.Run("linearizable/under_faults", func(t *testing.T) {
		// A guard for one process is checked within its promise: its
		// goroutines, with that process's link under faults.
		processes := 3
		if s.SingleProcess {
			processes = 1
		}
		ContendUnderFaults(t, s, faultConfig(processes)).RequireLinearizable(t)
	})
}

// calls checks what single calls see: what the guard promises, fn's error
// and panic, a lost race, ctx, an empty key. Every call is bounded
// (waitfor): a guard that hangs fails its check in seconds, named.
func calls(t *testing.T, s Suite) {
	t.Run("promises", func(t *testing.T) {
		// What the guard says of itself is what the rest of the suite
		// checks it does.
		g, _ := build(t, s)
		p, ok := g.(contend.Promiser)
		require.True(t, ok, "%T does not say what it promises", g)
		got := p.Promises()
		require.Equal(t, s.Exclusive, got.Exclusive, "Exclusive")
		require.Equal(t, !s.FailFast, got.Waits, "Waits")
		require.Equal(t, !s.SingleProcess, got.AcrossProcesses, "AcrossProcesses")
	})
	t.Run("returns_fn_error", func(t *testing.T) {
		g, k := build(t, s)
		sentinel := errors.New("fn failed")
		err := doFree(t, g, k, func(context.Context) error { return fmt.Errorf("wrapped: %w", sentinel) })
		require.ErrorIs(t, err, sentinel)
		err = doFree(t, g, k, func(context.Context) error { return sentinel })
		require.ErrorIs(t, err, sentinel)
		require.NoError(t, doFree(t, g, k, func(context.Context) error { return nil }))
	})
	t.Run("lost_race", func(t *testing.T) { lostRace(t, s) })
	t.Run("ctx_cancelled_before", func(t *testing.T) {
		g, k := build(t, s)
		ran := false
		err := waitfor.Call(t, freeBound, "ctx_cancelled_before: a call whose ctx had already ended did not return", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return g.Do(ctx, k, func(context.Context) error { ran = true; return nil })
		})
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, ran, "fn ran under a cancelled ctx")
		requireFree(t, g, k)
	})
	t.Run("ctx_cancelled_during_fn", func(t *testing.T) {
		g, k := build(t, s)
		err := waitfor.Call(t, freeBound, "ctx_cancelled_during_fn: the call did not return after fn saw its ctx end", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			return g.Do(ctx, k, func(ctx context.Context) error {
				cancel()
				<-ctx.Done()
				return ctx.Err()
			})
		})
		require.ErrorIs(t, err, context.Canceled)
		requireFree(t, g, k)
	})
	t.Run("panic_in_fn", func(t *testing.T) {
		g, k := build(t, s)
		var recovered any
		_ = waitfor.Call(t, freeBound, "panic_in_fn: the call did not re-raise fn's panic", func(ctx context.Context) error {
			defer func() { recovered = recover() }()
			return g.Do(ctx, k, func(context.Context) error { panic("boom") })
		})
		require.Equal(t, "boom", recovered, "Do must re-raise fn's panic")
		requireFree(t, g, k)
	})
	t.Run("careless_nesting", func(t *testing.T) { CarelessNesting(t, s, 3, nil) })
	if s.NewOn != nil {
		t.Run("one_session", func(t *testing.T) { oneSession(t, s) })
	}
	t.Run("empty_key", func(t *testing.T) {
		g, _ := build(t, s)
		ran := false
		err := doFree(t, g, "", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, contend.ErrInvalid)
		require.False(t, ran)
	})
}

// freeBound bounds a call on a key nobody holds: it connects, takes the key
// and runs fn, which a loaded machine does in well under a second.
const freeBound = 10 * time.Second

// doFree runs fn under g for key, which nobody else holds, bounded by
// freeBound.
func doFree(t *testing.T, g contend.Guard, key string, fn func(context.Context) error) error {
	t.Helper()
	return waitfor.Call(t, freeBound, fmt.Sprintf("a call on the free key %q never returned: the guard waits for nothing, or ignores ctx", key),
		func(ctx context.Context) error { return g.Do(ctx, key, fn) })
}

// keys returns n keys no other test uses: some guards keep their state
// database-wide (advisory locks), not in the test's schema.
func keys(n int) []string {
	base := testserver.RandomName("key-")
	ks := make([]string, n)
	for i := range ks {
		ks[i] = base + "-" + strconv.Itoa(i)
	}
	return ks
}

// build makes an environment in this process, sets it up for one fresh key and
// builds the guard.
func build(t *testing.T, s Suite) (contend.Guard, string) {
	t.Helper()
	env := open(t, s.Driver, testserver.URL(t, s.Driver), "")
	key := keys(1)[0]
	setup(t, s, env, []string{key})
	return newGuard(t, s, env), key
}

func setup(t testing.TB, s Suite, env Env, keys []string) {
	t.Helper()
	stmts := counterStatements(env.Dialect)
	_, err := env.DB.Exec(stmts.create)
	require.NoError(t, err)
	for _, k := range keys {
		_, err := env.DB.Exec(stmts.insert, k)
		require.NoError(t, err)
	}
	if s.Setup != nil {
		s.Setup(t, env, keys)
	}
}

func newGuard(t testing.TB, s Suite, env Env) contend.Guard {
	var g contend.Guard
	if s.New != nil {
		g = s.New(t, env)
	} else {
		var err error
		g, err = s.NewOn(env, env.Handle)
		require.NoError(t, err)
	}
	var closeGuard func(ctx context.Context) error
	switch c := g.(type) {
	case interface{ Close() error }:
		closeGuard = func(context.Context) error { return c.Close() }
	case interface{ Close(context.Context) error }:
		closeGuard = c.Close
	}
	if closeGuard != nil {
		t.Cleanup(func() {
			// Bounded, so that a guard whose Close waits for a call left
			// behind by a failed check fails the test, named, instead of
			// hanging it.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), closeBound)
			defer cancel()
			done := make(chan struct{})
			go func() { _ = closeGuard(ctx); close(done) }()
			select {
			case <-done:
			case <-time.After(closeBound + waitfor.Grace):
				t.Errorf("the guard's Close did not return within %v: it waits for a call that never ends", closeBound)
			}
		})
	}
	return g
}

// closeBound bounds a guard's Close at the end of a test: it waits for the
// guard's own goroutines, which end at once when no call is running.
const closeBound = 10 * time.Second

// open connects to the schema at url and to Redis; prefix "" makes a fresh
// Redis prefix, cleaned when t ends.
func open(t testing.TB, driver, url, prefix string) Env {
	t.Helper()
	client, fresh := testserver.Redis(t)
	if prefix == "" {
		prefix = fresh
	}
	return withHandle(t, driver, url, Env{Redis: client, Prefix: prefix})
}

// withHandle opens env's pools on url through driver.
func withHandle(t testing.TB, driver, url string, env Env) Env {
	t.Helper()
	env.DB = testserver.Open(t, driver, url)
	env.Handle = env.DB
	env.Dialect = testserver.Dialect(driver)
	if driver == testserver.PgxNative || driver == testserver.MariaDBDriver {
		env.Handle = testserver.Handle(t, driver, url)
	}
	return env
}

// requireFree checks that key is not held: a fail-fast guard must not answer
// ErrConflict, a waiting one must not wait.
func requireFree(t *testing.T, g contend.Guard, key string) {
	t.Helper()
	ran := false
	err := waitfor.Call(t, 5*time.Second, fmt.Sprintf("key %q is still held: a call on it never returned", key), func(ctx context.Context) error {
		return g.Do(ctx, key, func(context.Context) error { ran = true; return nil })
	})
	require.NoError(t, err, "key %q is still held", key)
	require.True(t, ran)
}

func lostRace(t *testing.T, s Suite) {
	g, k := build(t, s)
	inside, leave := make(chan struct{}), make(chan struct{})
	var (
		entered    sync.Once // an optimistic guard runs the holder's fn again
		left       sync.Once
		holderRuns atomic.Int32
		holderErr  = make(chan error, 1)
	)
	letGo := func() { left.Do(func() { close(leave) }) }
	// A failed check must not leave the holder inside for ever: the clean-up
	// of the pool and the schema would wait for it.
	t.Cleanup(letGo)
	go func() {
		holderErr <- g.Do(t.Context(), k, func(context.Context) error {
			holderRuns.Add(1)
			entered.Do(func() { close(inside) })
			<-leave
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-holderErr:
		t.Fatalf("lost_race: the holder did not get in on a free key: %v", err)
	case <-time.After(freeBound + waitfor.Grace):
		t.Fatalf("lost_race: the holder never got in on a free key, nor returned")
	}

	ran := false
	switch {
	case s.FailFast:
		err := waitfor.Call(t, freeBound, "lost_race: a fail-fast guard did not answer while another held the key", func(ctx context.Context) error {
			return g.Do(ctx, k, func(context.Context) error { ran = true; return nil })
		})
		require.NotErrorIs(t, err, context.DeadlineExceeded, "lost_race: a fail-fast guard waited for the holder instead of answering at once")
		require.False(t, ran, "lost_race: fn ran while another held the key: the guard did not exclude")
		require.ErrorIs(t, err, contend.ErrConflict)
		require.ErrorContains(t, err, k, "the conflict names its key")
	case s.Exclusive:
		// Long enough that, on a loaded machine, ctx ends in the wait for
		// the key and not while the call is still connecting, which is no
		// lost race.
		err := waitfor.Call(t, time.Second, "lost_race: the second caller never returned after its ctx ended: the guard ignores ctx in its wait", func(ctx context.Context) error {
			return g.Do(ctx, k, func(context.Context) error { ran = true; return nil })
		})
		require.False(t, ran, "lost_race: fn ran while another held the key: the guard did not exclude")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, contend.ErrConflict, "every guard gives a wait that ctx ended the same shape: a lost race, and ctx's error")
	default:
		// Nothing is held: the second caller runs and commits at once, and
		// the holder's commit must then notice the version moved.
		err := doFree(t, g, k, func(context.Context) error { ran = true; return nil })
		require.NoError(t, err)
		require.True(t, ran)
	}

	letGo()
	require.NoError(t, waitfor.Recv(t, holderErr, freeBound, "lost_race: the holder's call never returned after its fn did"))
	if !s.Exclusive && !s.FailFast {
		require.EqualValues(t, 2, holderRuns.Load(), "the holder's fn must run again after another caller committed")
	}
	requireFree(t, g, k)
}

// Report is what a contention run did and what the backend shows after it.
type Report struct {
	harness.Result
	// Counted is the sum of the counters fn incremented.
	Counted int64
	// Overlaps counts the times a fn found another fn for its key inside.
	Overlaps int64
	// Log is every call's call and return, from every process, and each
	// counter's final value; History is the verdict on it.
	Log     history.Log
	History history.Result
	// Workers counts the processes that ran the operation and reported.
	Workers int
	// UnderFaults is set in a run under faults; Faults is what they did.
	UnderFaults bool
	Faults      FaultCount
}

// Contend runs a read-modify-write of a counter inside Do from the goroutines
// and processes of cfg, and reports the outcome. Between the read and the
// write fn pauses, so an unguarded read-modify-write loses updates reliably.
func Contend(t *testing.T, s Suite, cfg harness.Config) Report {
	t.Helper()
	return contention(t, s, cfg, false)
}

// ContendUnderFaults is [Contend] with the first process to start talking to
// PostgreSQL and Redis through fault proxies that slow its link, lose a
// reply after its command ran and reset its connections, round after round,
// for the whole run. Each call is given 10s; the ones that fail count as
// errors, and the history models them as calls of unknown outcome.
func ContendUnderFaults(t *testing.T, s Suite, cfg harness.Config) Report {
	t.Helper()
	return contention(t, s, cfg, true)
}

func contention(t *testing.T, s Suite, cfg harness.Config, faults bool) Report {
	t.Helper()
	var (
		env   Env
		dir   string  // set by setup, so only in the test process
		local *worker // the test process's own, when it runs the operation
	)
	res := harness.Run(t, cfg,
		func() harness.Params {
			url := testserver.URL(t, s.Driver)
			env = open(t, s.Driver, url, "")
			setup(t, s, env, cfg.Keys)
			dir = t.TempDir()
			return harness.Params{"url": url, "prefix": env.Prefix, "dir": dir, "faults": strconv.FormatBool(faults)}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			w := newWorker(t, s, p)
			if dir != "" {
				local = w
			} else {
				t.Cleanup(func() { w.save(t, p["dir"]) })
			}
			return w.op
		})
	rep := Report{Result: res, UnderFaults: faults}
	require.NoError(t, env.DB.Get(&rep.Counted, `SELECT coalesce(sum(n), 0) FROM `+counterTable))
	overlaps, err := env.Redis.Get(t.Context(), env.Prefix+"overlaps").Int64()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
	}
	rep.Overlaps = overlaps
	all := collect(t, dir, local)
	rep.Workers, rep.Log, rep.Faults = all.Workers, all.Log, all.Faults
	require.Equal(t, max(cfg.Processes, 1), rep.Workers, "a process's history is missing")
	for _, k := range cfg.Keys {
		call := history.Now()
		var n int64
		require.NoError(t, env.DB.Get(&n, counterStatements(env.Dialect).get, k))
		rep.Log.Ops = append(rep.Log.Ops, history.Observed(k, call, n))
	}
	rep.History = history.Check(rep.Log, checkTimeout)
	return rep
}

// RequireHeld checks the invariants of s's contract on r.
func (r Report) RequireHeld(t *testing.T, s Suite) {
	t.Helper()
	t.Logf("successes %d, conflicts %d, errors %d, counted %d, overlaps %d, p50 %v, p99 %v",
		r.Successes, r.Conflicts, r.Errors, r.Counted, r.Overlaps, r.Percentile(.5), r.Percentile(.99))
	require.Zero(t, r.Errors, "failures: %v", r.FirstErrors)
	require.Positive(t, r.Successes)
	require.EqualValues(t, r.Successes, r.Counted, "lost updates: %d calls succeeded, the counters show %d", r.Successes, r.Counted)
	if s.Exclusive {
		require.Zero(t, r.Overlaps, "two fns for one key were inside at once")
	}
	if !s.FailFast {
		require.Zero(t, r.Conflicts, "a waiting guard gave up")
	}
	r.RequireLinearizable(t)
}

// RequireLinearizable checks that the history of r is linearizable, key by
// key, and that r did something worth checking; under faults, that the
// faults were real.
func (r Report) RequireLinearizable(t *testing.T) {
	t.Helper()
	t.Logf("history: %v", r.History)
	if !r.History.Linearizable() {
		// A view of the first two keys is enough to start from, and leaves
		// fewer files behind.
		for _, key := range r.History.Illegal[:min(2, len(r.History.Illegal))] {
			t.Logf("history of %s: %s", key, r.visualize(key))
		}
		t.Fatalf("the history is not linearizable: %v", r.History)
	}
	require.Positive(t, r.Successes, "no call succeeded; first errors: %v", r.FirstErrors[:min(3, len(r.FirstErrors))])
	if r.UnderFaults {
		t.Logf("faults: %d resets cut %d connections, %d replies set to be lost; %d calls failed (%d after fn wrote), e.g. %v",
			r.Faults.Resets, r.Faults.Reset, r.Faults.Drops, r.Errors, r.History.Maybes, r.FirstErrors[:min(3, len(r.FirstErrors))])
		require.Positive(t, r.Faults.Reset, "the faults cut no connection: the run did not test what it claims")
	}
}

// RequireLost checks that r, the run of a negative control, lost updates
// and that the history checker saw it: without errors, the counters show
// fewer increments than calls succeeded.
func (r Report) RequireLost(t *testing.T) {
	t.Helper()
	t.Logf("successes %d, counted %d, errors %d; history: %v", r.Successes, r.Counted, r.Errors, r.History)
	require.Zero(t, r.Errors, "%v", r.FirstErrors)
	require.Less(t, r.Counted, int64(r.Successes), "no update lost: the run is too weak to show what it controls")
	require.False(t, r.History.Linearizable(), "the counters lost updates and the checker did not see it")
}

// visualize writes porcupine's view of key's history to a file that outlives
// the test, and returns its name.
func (r Report) visualize(key string) string {
	f, err := os.CreateTemp("", "contend-history-*.html")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if err := r.History.Visualize(f, key, checkTimeout); err != nil {
		return err.Error()
	}
	return f.Name()
}

// increment is fn: a read-modify-write of key's counter through the guard's
// querier, recorded in call, and an overlap check outside the guard.
func increment(ctx context.Context, env Env, key string, call *history.Call) error {
	call.Reading()
	marker := env.Prefix + "inside:" + key
	n, err := env.Redis.Incr(ctx, marker).Result()
	if err != nil {
		return err
	}
	defer env.Redis.Decr(context.WithoutCancel(ctx), marker)
	if n > 1 {
		env.Redis.Incr(ctx, env.Prefix+"overlaps")
	}
	q := testserver.Querier(ctx, env.Handle)
	stmts := counterStatements(env.Dialect)
	var v int64
	if err := q.QueryRow(ctx, stmts.get, key).Scan(&v); err != nil {
		return err
	}
	// Widen the window between read and write, so that a guard that does not
	// keep callers apart loses updates every run, not once in a while.
	time.Sleep(time.Millisecond)
	call.Sending(v)
	_, err = q.Exec(ctx, stmts.set, stmts.setArgs(key, v+1)...)
	return err
}

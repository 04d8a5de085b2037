package pessimistic_test

import (
	"context"
	"database/sql"
	"errors"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/internal/workload"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/pessimistic"
)

// The tests of this file run the advisory guard on MariaDB, through
// go-sql-driver/mysql: GET_LOCK on a connection each call holds.

// lockName is the guard's lock name for a key, as any client computes it.
const lockName = "CONCAT('contend:', SHA2(?, 224))"

func TestAdvisoryIsAGuardOnMariaDB(t *testing.T) {
	for _, mode := range []pessimistic.OnHeld{pessimistic.Wait, pessimistic.NoWait} {
		t.Run(mode.String(), func(t *testing.T) {
			guardtest.Run(t, guardtest.Suite{
				Driver: testserver.MariaDBDriver,
				NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
					return pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{OnHeld: mode})
				},
				FailFast:  mode != pessimistic.Wait,
				Exclusive: true,
				Ops:       8,
			})
		})
	}
}

// mariaAdvisory returns the test's pool on a database of its own, the
// wrapped handle, and a second pool for other sessions.
func mariaAdvisory(t testing.TB) (testserver.MariaDBHandle, *sqlx.DB) {
	t.Helper()
	u := testserver.MariaDB(t)
	return testserver.Handle(t, testserver.MariaDBDriver, u).(testserver.MariaDBHandle), testserver.Open(t, testserver.MariaDBDriver, u)
}

// plainLock takes key's lock the way another program would, in plain SQL,
// on a session of its own that holds it until the test ends or calls the
// returned release.
func plainLock(t testing.TB, db *sqlx.DB, key string) (got bool, release func()) {
	t.Helper()
	c, err := db.Conn(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.QueryRowContext(t.Context(), "SELECT GET_LOCK("+lockName+", 0)", key).Scan(&got))
	return got, func() {
		var released bool
		require.NoError(t, c.QueryRowContext(context.WithoutCancel(t.Context()), "SELECT RELEASE_LOCK("+lockName+")", key).Scan(&released))
		require.True(t, released)
	}
}

// The lock name is the server's CONCAT('contend:', SHA2(key, 224)), 64
// characters for any key, so a program that locks the same name in plain
// SQL excludes and is excluded by the guard, with keys longer than MySQL's
// 64-character limit on names too.
func TestAdvisoryAgreesWithPlainSQLOnMariaDB(t *testing.T) {
	t.Parallel()
	h, other := mariaAdvisory(t)
	try, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait})
	require.NoError(t, err)
	ctx := t.Context()
	noop := func(context.Context) error { return nil }
	for _, key := range []string{testserver.RandomName("report:"), strings.Repeat("long key ", 200) + testserver.RandomName("")} {
		require.NoError(t, try.Do(ctx, key, func(context.Context) error {
			got, _ := plainLock(t, other, key)
			require.False(t, got, "the guard holds the name plain SQL computes")
			return nil
		}))
		got, release := plainLock(t, other, key)
		require.True(t, got, "released when the call returned")
		err := try.Do(ctx, key, noop)
		require.ErrorIs(t, err, contend.ErrConflict)
		require.ErrorContains(t, err, key[:20])
		require.NoError(t, try.Do(ctx, key+"-other", noop), "other keys are free")
		release()
		require.NoError(t, try.Do(ctx, key, noop))
	}
}

// usersLockWaits counts the sessions of db's database waiting in GET_LOCK.
func userLockWaits(t testing.TB, db *sqlx.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND STATE = 'User lock'"))
	return n
}

// A waiting guard ends its wait at the lock timeout (a lost race), at ctx's
// deadline and at ctx's cancel (a lost race and ctx's error). A wait that
// ctx ended leaves nothing waiting on the server, and the next caller gets
// the key as soon as its holder lets go.
func TestAdvisoryWaitsOnMariaDB(t *testing.T) {
	t.Parallel()
	h, other := mariaAdvisory(t)
	key := testserver.RandomName("wait:")
	got, release := plainLock(t, other, key)
	require.True(t, got)
	fnRan := errors.New("fn ran")
	fn := func(context.Context) error { return fnRan }

	timed, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	err = timed.Do(t.Context(), key, fn)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "lock timeout of 1s", "GET_LOCK counts whole seconds here, rounded up")

	a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = a.Do(ctx, key, fn)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// go-sql-driver/mysql closed the connection; MariaDB ends the wait of a
	// closed connection by itself (within a second, as measured).
	require.Eventually(t, func() bool { return userLockWaits(t, other) == 0 }, 5*time.Second, 10*time.Millisecond,
		"a wait ctx's deadline ended is still waiting on the server")

	ctx, cancel = context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- a.Do(ctx, key, fn) }()
	require.Eventually(t, func() bool { return userLockWaits(t, other) == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	err = <-errc
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.Canceled)
	require.Eventually(t, func() bool { return userLockWaits(t, other) == 0 }, 5*time.Second, 10*time.Millisecond,
		"a wait ctx ended is still waiting on the server")

	inside := make(chan struct{})
	errc = make(chan error, 1)
	go func() {
		errc <- a.Do(t.Context(), key, func(context.Context) error { close(inside); return nil })
	}()
	require.Eventually(t, func() bool { return userLockWaits(t, other) == 1 }, 5*time.Second, 5*time.Millisecond)
	release()
	select {
	case <-inside:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the key its holder let go")
	}
	require.NoError(t, <-errc)
}

// leakPaths runs lock on key down every path a call can end by, and returns
// those after which a session of pool still held key's lock: fn's success,
// error and panic, fn taking the lock a second time, ctx ended while
// holding and while waiting, and the connection fn runs on killed. other is a pool of other sessions.
func leakPaths(t *testing.T, pool, other *sqlx.DB, lock func(ctx context.Context, key string, fn func(context.Context) error) error) []string {
	t.Helper()
	var leaked []string
	for _, p := range []struct {
		name string
		run  func(key string)
	}{
		{"success", func(key string) {
			_ = lock(t.Context(), key, func(context.Context) error { return nil })
		}},
		{"fn error", func(key string) {
			_ = lock(t.Context(), key, func(context.Context) error { return errors.New("fn failed") })
		}},
		{"panic", func(key string) {
			func() {
				defer func() { _ = recover() }()
				_ = lock(t.Context(), key, func(context.Context) error { panic("boom") })
			}()
		}},
		{"fn takes the lock again and keeps it", func(key string) {
			// GET_LOCK is reentrant: on the call's connection fn gets it
			// at once, and the session then holds it twice.
			_ = lock(t.Context(), key, func(ctx context.Context) error {
				_, err := contend.Querier(ctx, pool).ExecContext(ctx, "DO GET_LOCK("+lockName+", 0)", key)
				return err
			})
		}},
		{"ctx ended while holding", func(key string) {
			ctx, cancel := context.WithCancel(t.Context())
			_ = lock(ctx, key, func(ctx context.Context) error { cancel(); return ctx.Err() })
		}},
		{"ctx ended while waiting", func(key string) {
			got, release := plainLock(t, other, key)
			require.True(t, got)
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() { errc <- lock(ctx, key, func(context.Context) error { return nil }) }()
			require.Eventually(t, func() bool { return userLockWaits(t, other) == 1 }, 5*time.Second, 5*time.Millisecond)
			cancel()
			<-errc
			release()
		}},
		{"connection killed while holding", func(key string) {
			_ = lock(t.Context(), key, func(ctx context.Context) error {
				q := contend.Querier(ctx, pool)
				var id int64
				if err := q.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					return err
				}
				if _, err := other.Exec("KILL ?", id); err != nil {
					return err
				}
				_, err := q.ExecContext(ctx, "DO 1")
				return err
			})
		}},
	} {
		key := testserver.RandomName("leak:")
		p.run(key)
		// Every connection the pool may hand out, asked whether its
		// session holds the lock: the next user of such a connection
		// would "hold" the key without asking, and nobody else get it.
		conns := make([]*sql.Conn, pool.Stats().MaxOpenConnections)
		held := false
		for i := range conns {
			c, err := pool.Conn(t.Context())
			require.NoError(t, err)
			conns[i] = c
			var mine bool
			require.NoError(t, c.QueryRowContext(t.Context(), "SELECT IS_USED_LOCK("+lockName+") <=> CONNECTION_ID()", key).Scan(&mine))
			held = held || mine
		}
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
		if held {
			leaked = append(leaked, p.name)
			continue
		}
		// And nobody else holds it either: a killed session's locks go
		// once the server has ended it.
		require.Eventually(t, func() bool {
			var free bool
			return other.Get(&free, "SELECT IS_FREE_LOCK("+lockName+")", key) == nil && free
		}, 5*time.Second, 10*time.Millisecond, "%s: the lock is held by a session outside the pool", p.name)
	}
	return leaked
}

// GET_LOCK belongs to the session: a connection given back to the pool
// while it holds the lock keeps it. Down every path a call can end by, no
// connection of the guard's pool holds the lock after the call. The naive
// way, GET_LOCK and RELEASE_LOCK through the pool, leaks it: the release
// runs on whichever connection the pool hands out, or not at all once ctx
// has ended.
func TestAdvisoryLeavesNoLockInThePoolOnMariaDB(t *testing.T) {
	t.Parallel()
	t.Run("guard", func(t *testing.T) {
		t.Parallel()
		h, other := mariaAdvisory(t)
		h.DB.SetMaxOpenConns(2)
		a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
		require.NoError(t, err)
		require.Empty(t, leakPaths(t, h.DB, other, a.Do))
	})
	t.Run("naive_control", func(t *testing.T) {
		t.Parallel()
		h, other := mariaAdvisory(t)
		h.DB.SetMaxOpenConns(2)
		naive := func(ctx context.Context, key string, fn func(context.Context) error) error {
			var got bool
			if err := h.DB.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", 10)", key).Scan(&got); err != nil || !got {
				return errors.New("not had")
			}
			defer h.DB.ExecContext(ctx, "DO RELEASE_LOCK("+lockName+")", key)
			return fn(ctx)
		}
		leaked := leakPaths(t, h.DB, other, naive)
		t.Logf("the naive lock leaked to the pool after: %v", leaked)
		require.Contains(t, leaked, "ctx ended while holding", "the naive lock did not leak: the check cannot see a leak")
	})
}

// The guard gives its connection back to the pool after a clean release,
// and discards it whenever the server's word that the lock is released is
// missing: the connection died, the release's answer was lost, or
// GET_LOCK's was (the server may have granted it). The pool holds one
// connection, so a new connection id shows the old one was discarded.
func TestAdvisoryKeepsOrDiscardsItsConnectionOnMariaDB(t *testing.T) {
	t.Parallel()
	u := testserver.MariaDB(t)
	other := testserver.Open(t, testserver.MariaDBDriver, u)
	pu, err := neturl.Parse(u)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, pu.Host)
	pu.Host = proxy.Addr()
	proxied := pu.String()
	db := testserver.Open(t, testserver.MariaDBDriver, proxied)
	db.SetMaxOpenConns(1)
	a, err := pessimistic.NewAdvisory(mysqldb.Wrap(db), pessimistic.AdvisoryConfig{FinishTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	key := testserver.RandomName("conn:")
	// call runs the guard and returns the id of the session fn ran in.
	call := func(ctx context.Context, then func(ctx context.Context)) (int64, error) {
		var id int64
		err := a.Do(ctx, key, func(ctx context.Context) error {
			if err := contend.Querier(ctx, db).QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				return err
			}
			then(ctx)
			return nil
		})
		return id, err
	}
	nothing := func(context.Context) {}
	free := func() bool {
		var free bool
		return other.Get(&free, "SELECT IS_FREE_LOCK("+lockName+")", key) == nil && free
	}

	first, err := call(t.Context(), nothing)
	require.NoError(t, err)
	again, err := call(t.Context(), nothing)
	require.NoError(t, err)
	require.Equal(t, first, again, "a connection whose lock was released goes back to the pool")
	require.True(t, free())
	// ctx ends while fn holds the lock: the release runs all the same, on a
	// context of its own, and the connection is kept.
	ctx, cancel := context.WithCancel(t.Context())
	_, err = call(ctx, func(context.Context) { cancel() })
	require.ErrorIs(t, err, context.Canceled)
	again, err = call(t.Context(), nothing)
	require.NoError(t, err)
	require.Equal(t, first, again, "the release after ctx ended did not run")
	require.True(t, free())

	// The release's reply is lost: the release gives up at the finish
	// bound, and the connection must go, whatever the server did.
	lost, err := call(t.Context(), func(context.Context) { proxy.DropReplyTo("RELEASE_ALL_LOCKS") })
	require.NoError(t, err, "fn's transaction committed; the lock goes with the session")
	require.Equal(t, first, lost)
	require.Eventually(t, free, 5*time.Second, 10*time.Millisecond)
	next, err := call(t.Context(), nothing)
	require.NoError(t, err)
	require.NotEqual(t, lost, next, "a connection whose release was not answered went back to the pool")

	// GET_LOCK's reply is lost: the server granted the lock, the caller
	// never heard and gives up at ctx's deadline.
	proxy.DropReplyTo("GET_LOCK")
	ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = call(ctx, nothing)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, free, 5*time.Second, 10*time.Millisecond)
	last, err := call(t.Context(), nothing)
	require.NoError(t, err)
	require.NotEqual(t, next, last)

	// The commit answers, but after the finish bound: the call gives up on
	// it, and the release, whose time is gone, is never sent. The
	// connection still holds the lock: it must not go back to the pool.
	_, err = call(t.Context(), func(context.Context) { proxy.SetLatency(200 * time.Millisecond) })
	require.ErrorIs(t, err, context.DeadlineExceeded, "the commit outlived the finish bound")
	proxy.SetLatency(0)
	require.Eventually(t, free, 5*time.Second, 10*time.Millisecond, "the lock stayed in the pool")
	last, err = call(t.Context(), nothing)
	require.NoError(t, err)

	// The connection dies under fn: the commit fails, the server drops the
	// lock with the session, and the pool gets a new connection.
	_, err = call(t.Context(), func(ctx context.Context) { proxy.Reset() })
	require.Error(t, err)
	require.Eventually(t, free, 5*time.Second, 10*time.Millisecond)
	after, err := call(t.Context(), nothing)
	require.NoError(t, err)
	require.NotEqual(t, last, after)
}

// mariaSell is the naive read-check-write of a sale of products (mariaRows:
// n is the stock), through whatever transaction ctx carries: correct only
// under a guard.
func mariaSell(ctx context.Context, db *sqlx.DB, key string) error {
	q := contend.Querier(ctx, db)
	var n int
	if err := q.QueryRowContext(ctx, "SELECT n FROM products WHERE id = ?", key).Scan(&n); err != nil {
		return err
	}
	if n < 1 {
		return workload.ErrSoldOut
	}
	time.Sleep(time.Millisecond) // others read the same stock meanwhile, unless kept out
	_, err := q.ExecContext(ctx, "UPDATE products SET n = ? WHERE id = ?", n-1, key)
	return err
}

// Sellers in 3 processes sell one hot item of stock 100 under the advisory
// guard, 192 attempts: exactly the stock is sold. The negative control, the
// same sales under a process-local mutex, loses sales across processes.
func TestAdvisorySellsExactlyTheStockOnMariaDB(t *testing.T) {
	const stock = 100
	cfg := harness.Config{Processes: 3, Goroutines: 16, Ops: 4}
	sellUnder := func(t *testing.T, guard func(t testing.TB, h testserver.MariaDBHandle) contend.Guard) (harness.Result, int) {
		var db *sqlx.DB
		res := harness.Run(t, cfg,
			func() harness.Params {
				u := testserver.MariaDB(t)
				db = testserver.Open(t, testserver.MariaDBDriver, u)
				mariaRows(t, db, "products", "hot")
				_, err := db.Exec("UPDATE products SET n = ?", stock)
				require.NoError(t, err)
				return harness.Params{"url": u}
			},
			func(t testing.TB, p harness.Params) harness.Op {
				h := testserver.Handle(t, testserver.MariaDBDriver, p["url"]).(testserver.MariaDBHandle)
				return workload.Guarded(guard(t, h), func(ctx context.Context, key string) error { return mariaSell(ctx, h.DB, key) })
			})
		var left int
		require.NoError(t, db.Get(&left, "SELECT n FROM products WHERE id = 'hot'"))
		t.Logf("sold %d, refused %d, errors %d, stock left %d, p99 %v", res.Successes, res.Conflicts, res.Errors, left, res.Percentile(.99))
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		return res, left
	}
	t.Run("advisory", func(t *testing.T) {
		res, left := sellUnder(t, func(t testing.TB, h testserver.MariaDBHandle) contend.Guard {
			a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
			require.NoError(t, err)
			return a
		})
		require.Equal(t, stock, res.Successes)
		require.Zero(t, left)
	})
	t.Run("mutex_control", func(t *testing.T) {
		res, left := sellUnder(t, func(testing.TB, testserver.MariaDBHandle) contend.Guard { return &workload.MutexGuard{} })
		require.Greater(t, res.Successes, stock-left, "a process-local mutex lost no sale across processes: the test cannot fail")
	})
}

// On MySQL the lock belongs to a session: the guard needs a pool to hold a
// connection of its own per call, and cannot join a transaction, whose
// commit its release would come before.
func TestAdvisoryNeedsAPoolOnMariaDB(t *testing.T) {
	t.Parallel()
	h, _ := mariaAdvisory(t)
	ctx := t.Context()
	tx, err := h.DB.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	c, err := h.DB.Conn(ctx)
	require.NoError(t, err)
	defer c.Close()
	for name, db := range map[string]contend.DB{"tx": mysqldb.Wrap(tx), "conn": mysqldb.Wrap(c)} {
		_, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{})
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}

	a, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{})
	require.NoError(t, err)
	ran := false
	err = pessimistic.InTx(ctx, h, nil, func(ctx context.Context) error {
		return a.Do(ctx, "nested", func(context.Context) error { ran = true; return nil })
	})
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.False(t, ran)
}

func TestAdvisoryLockUnderFaultsOnMariaDB(t *testing.T) {
	t.Parallel()
	txntest.RunOnMariaDB(t, txntest.Subject{Transactional: true, New: func(t testing.TB, db contend.DB, finish time.Duration) txntest.Op {
		a, err := pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{FinishTimeout: finish})
		require.NoError(t, err)
		return guardOp(a, db)
	}})
}

// The Observer hears the same events on MariaDB: the lock had and let go,
// a key held under NOWAIT (a conflict), and a wait GET_LOCK's timeout
// ended (given up).
func TestAdvisoryObserverOnMariaDB(t *testing.T) {
	t.Parallel()
	h, other := mariaAdvisory(t)
	var rec recorder
	key := testserver.RandomName("observed:")
	noop := func(context.Context) error { return nil }
	try, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait, Observer: &rec})
	require.NoError(t, err)
	require.NoError(t, try.Do(t.Context(), key, noop))
	rec.take(t, key, contend.EventObtained, contend.EventReleased)

	got, _ := plainLock(t, other, key)
	require.True(t, got)
	err = try.Do(t.Context(), key, noop)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Equal(t, err, rec.take(t, key, contend.EventConflict)[0].Err)

	wait, err := pessimistic.NewAdvisory(h, pessimistic.AdvisoryConfig{LockTimeout: time.Millisecond, Observer: &rec})
	require.NoError(t, err)
	err = wait.Do(t.Context(), key, noop)
	require.ErrorIs(t, err, contend.ErrConflict)
	e := rec.take(t, key, contend.EventGaveUp)[0]
	require.Equal(t, err, e.Err)
	require.GreaterOrEqual(t, e.Wait, time.Second, "GET_LOCK waits whole seconds")
}

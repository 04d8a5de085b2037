package optimistic_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
)

// The tests of this file run on MariaDB, through go-sql-driver/mysql.

// mariaAccounts creates the accounts table on MariaDB with a row of balance
// 100 for each id; the CHECK makes an overdraft an error.
func mariaAccounts(t testing.TB, db *sqlx.DB, ids ...string) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE accounts (
		id varchar(64) PRIMARY KEY,
		owner varchar(64) NOT NULL DEFAULT '',
		balance bigint NOT NULL CHECK (balance >= 0),
		version bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	for _, id := range ids {
		_, err := db.Exec(`INSERT INTO accounts (id, owner, balance) VALUES (?, 'ann', 100)`, id)
		require.NoError(t, err)
	}
}

func mariaRow(t testing.TB, db *sqlx.DB, id string) account {
	t.Helper()
	var a account
	require.NoError(t, db.Get(&a, `SELECT * FROM accounts WHERE id = ?`, id))
	return a
}

// mariaSetup returns a handle on a database of the test's own, opened with
// params (a DSN query, "" for none).
func mariaSetup(t *testing.T, params string) testserver.MariaDBHandle {
	t.Helper()
	url := testserver.MariaDB(t)
	if params != "" {
		url += "?" + params
	}
	return testserver.Handle(t, testserver.MariaDBDriver, url).(testserver.MariaDBHandle)
}

// mariaWithdraw is withdraw in MySQL's words.
func mariaWithdraw(db *sqlx.DB, id string, amount int64) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		var balance int64
		if err := q.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, id).Scan(&balance); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance-amount, id)
		return err
	}
}

// user has a unique column besides its key.
type user struct {
	ID      string `db:"id"`
	Email   string `db:"email"`
	Version int64  `db:"version"`
}

// The Store's statements in MySQL's words: placeholders bind in the order
// they appear, so each value lands in its own column; a write of the values
// the row holds is a win (every write moves the version, so the row changes
// and counts with or without clientFoundRows); an insert of an existing key
// is a lost race, and one that runs into another unique column is not.
// (Under clientFoundRows, which the handle must set, INSERT ... ON
// DUPLICATE KEY UPDATE id = id would count a duplicate as 1 row, an insert.)
func TestStoreOnMariaDB(t *testing.T) {
	t.Parallel()
	h := mariaSetup(t, "")
	db := h.DB
	mariaAccounts(t, db, "a")
	s := accountStore(t, h, accountsConfig)
	ctx := t.Context()

	got, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 100}, got)
	_, err = s.Get(ctx, "a' OR '1'='1")
	require.ErrorIs(t, err, contend.ErrNotFound, "keys are values, never SQL")

	got, err = s.Update(ctx, "a", func(a *account) error { a.Balance -= 30; a.Owner = "ann b."; return nil })
	require.NoError(t, err)
	want := account{ID: "a", Owner: "ann b.", Balance: 70, Version: 1}
	require.Equal(t, want, got)
	require.Equal(t, want, mariaRow(t, db, "a"))

	// The same values again: applied.
	same := got
	require.NoError(t, s.Save(ctx, &same))
	require.EqualValues(t, 2, same.Version)
	require.NoError(t, s.Touch(ctx, &same))
	require.EqualValues(t, 3, same.Version)
	stale := got
	stale.Balance = 0
	require.ErrorIs(t, s.Save(ctx, &stale), contend.ErrConflict)
	require.ErrorIs(t, s.Delete(ctx, &stale), contend.ErrConflict)
	require.Equal(t, account{ID: "a", Owner: "ann b.", Balance: 70, Version: 3}, mariaRow(t, db, "a"))

	b := account{ID: "b", Owner: "bob", Balance: 5}
	require.NoError(t, s.Insert(ctx, &b))
	require.Equal(t, b, mariaRow(t, db, "b"))
	dup := account{ID: "b", Owner: "eve", Balance: 1000}
	require.ErrorIs(t, s.Insert(ctx, &dup), contend.ErrConflict, "insert of an existing key")
	require.Equal(t, b, mariaRow(t, db, "b"), "the existing row is untouched")
	require.NoError(t, s.Delete(ctx, &b))
	_, err = s.Get(ctx, "b")
	require.ErrorIs(t, err, contend.ErrNotFound)

	_, err = db.Exec(`CREATE TABLE users (id varchar(64) PRIMARY KEY, email varchar(64) NOT NULL UNIQUE, version bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	users, err := optimistic.NewStore[user](h, optimistic.Config{Table: "users"})
	require.NoError(t, err)
	require.NoError(t, users.Insert(ctx, &user{ID: "u1", Email: "x@example.com"}))
	err = users.Insert(ctx, &user{ID: "u2", Email: "x@example.com"})
	require.Error(t, err)
	require.NotErrorIs(t, err, contend.ErrConflict, "another unique column is not the key: no lost race")
	require.Equal(t, uint16(sqlerr.MySQLDupEntry), mysqlNumber(err))

	// Inside a transaction, a duplicate fails the insert only: the
	// transaction goes on and commits what it did before.
	err = pessimistic.InTx(ctx, h, nil, func(ctx context.Context) error {
		if err := s.Insert(ctx, &account{ID: "c", Balance: 1}); err != nil {
			return err
		}
		require.ErrorIs(t, s.Insert(ctx, &account{ID: "c", Balance: 2}), contend.ErrConflict)
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, mariaRow(t, db, "c").Balance)
}

func mysqlNumber(err error) uint16 {
	n, _ := sqlerr.MySQLNumber(err)
	return n
}

// A handle whose DSN lacks clientFoundRows is refused at its first call (the
// constructors do no I/O): a win that changed nothing would read as a lost
// race.
func TestRefusesRowsChangedOnMariaDB(t *testing.T) {
	t.Parallel()
	cfg, err := testserver.MariaDBConfig(testserver.MariaDB(t))
	require.NoError(t, err)
	cfg.ClientFoundRows = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	h := mysqldb.Wrap(db)
	s, err := optimistic.NewStore[account](h, accountsConfig)
	require.NoError(t, err)
	_, err = s.Get(t.Context(), "a")
	require.ErrorIs(t, err, mysqldb.ErrAffectedRows)
	g, err := optimistic.NewGuard(h, accountsConfig)
	require.NoError(t, err)
	err = g.Do(t.Context(), "a", func(context.Context) error {
		t.Error("fn ran on a handle that counts rows changed")
		return nil
	})
	require.ErrorIs(t, err, mysqldb.ErrAffectedRows)
}

func TestGuardDoOnMariaDB(t *testing.T) {
	t.Parallel()
	h := mariaSetup(t, "")
	db := h.DB
	mariaAccounts(t, db, "a")
	g, err := optimistic.NewGuard(h, accountsConfig)
	require.NoError(t, err)
	ctx := t.Context()

	require.NoError(t, g.Do(ctx, "a", mariaWithdraw(db, "a", 30)))
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 70, Version: 1}, mariaRow(t, db, "a"))
	require.NoError(t, g.Do(ctx, "a", func(context.Context) error { return nil }), "a fn that writes nothing wins")
	require.EqualValues(t, 2, mariaRow(t, db, "a").Version)

	sentinel := errors.New("fn failed")
	err = g.Do(ctx, "a", func(ctx context.Context) error {
		if err := mariaWithdraw(db, "a", 70)(ctx); err != nil {
			return err
		}
		return sentinel
	})
	require.Equal(t, sentinel, err)
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 70, Version: 2}, mariaRow(t, db, "a"), "fn's write rolled back")
	err = g.Do(ctx, "ghost", func(context.Context) error { t.Error("fn ran for a missing row"); return nil })
	require.ErrorIs(t, err, contend.ErrNotFound)
}

// The whole Guard contract on MariaDB, at the guard's default isolation
// there, READ COMMITTED: fn's read-pause-write of a counter from goroutines
// and from three processes loses no update.
func TestGuardIsAGuardOnMariaDB(t *testing.T) {
	s := guardSuite(testserver.MariaDBDriver)
	s.Ops = 4 // a hot key's losers retry until they win: keep the run short
	guardtest.Run(t, s)
}

// txGuard runs fn in a plain transaction at the server's default isolation
// (REPEATABLE READ on MariaDB), retried on deadlocks: no version check.
type txGuard struct{ db contend.DB }

func (g txGuard) Do(ctx context.Context, _ string, fn func(ctx context.Context) error) error {
	return pessimistic.InTx(ctx, g.db, nil, fn)
}

// The conformance suite's read-pause-write of a counter, from three
// processes, with InnoDB's REPEATABLE READ: the guard at that isolation
// loses no update, since its check reads the latest committed version
// whatever the snapshot; fn's read-pause-write in a plain transaction at
// the server's default isolation, the negative control, loses updates
// (REPEATABLE READ does not refuse a write over a row changed since the
// snapshot, as PostgreSQL's does).
func TestReadPauseWriteAtRepeatableReadOnMariaDB(t *testing.T) {
	cfg := harness.Config{Processes: 3, Goroutines: 8, Ops: 6, Keys: []string{"a", "b"}}
	t.Run("guard", func(t *testing.T) {
		s := guardSuite(testserver.MariaDBDriver)
		s.New = func(t testing.TB, env guardtest.Env) contend.Guard {
			g, err := optimistic.NewGuard(env.Handle, optimistic.Config{
				Table: "guardtest_counters", KeyColumn: "key", Retry: bigBudget, Isolation: sql.LevelRepeatableRead,
			})
			require.NoError(t, err)
			return g
		}
		guardtest.Contend(t, s, cfg).RequireHeld(t, s)
	})
	t.Run("naive_control", func(t *testing.T) {
		s := guardtest.Suite{
			Driver: testserver.MariaDBDriver,
			New:    func(_ testing.TB, env guardtest.Env) contend.Guard { return txGuard{env.Handle} },
		}
		guardtest.Contend(t, s, cfg).RequireLost(t)
	})
}

// A row lock taken in the guard's fn joins the guard's transaction, which
// read the version first. Under REPEATABLE READ that read fixed the
// snapshot, and the lock's fn reads its row as it was then: the suite's
// read-pause-write of a counter under the lock, from 3 processes, loses
// updates (the negative control). At the guard's default, READ COMMITTED,
// the same calls lose none.
func TestLockInsideAGuardReadsTheLatestCommitOnMariaDB(t *testing.T) {
	guardtest.NestedLosesNoUpdate(t, testserver.MariaDBDriver,
		func(t testing.TB, env guardtest.Env, isolation sql.IsolationLevel) contend.Guard {
			g, err := optimistic.NewGuard(env.Handle, optimistic.Config{Table: guardtest.OuterTable, Retry: bigBudget, Isolation: isolation})
			require.NoError(t, err)
			return g
		},
		lockerOnCounters)
}

// lockerOnCounters is a row Locker on the suite's counters.
func lockerOnCounters(t testing.TB, env guardtest.Env) contend.Guard {
	l, err := pessimistic.NewLocker(env.Handle, pessimistic.LockerConfig{Table: "guardtest_counters", KeyColumn: "key"})
	require.NoError(t, err)
	return l
}

// Store.Update's increments of one hot counter from 3 processes on MariaDB:
// every increment lands once, one version per write. The same increment as
// a plain read and a write of read+1, the negative control, loses updates.
func TestUpdateCounterUnderContentionOnMariaDB(t *testing.T) {
	run := func(t *testing.T, op func(h testserver.MariaDBHandle) harness.Op) (harness.Result, counter) {
		var db *sqlx.DB
		res := harness.Run(t, harness.Config{Processes: 3, Goroutines: 16, Ops: 4},
			func() harness.Params {
				url := testserver.MariaDB(t)
				db = testserver.Open(t, testserver.MariaDBDriver, url)
				_, err := db.Exec(`CREATE TABLE counters (id varchar(64) PRIMARY KEY, n bigint NOT NULL, version bigint NOT NULL DEFAULT 0)`)
				require.NoError(t, err)
				_, err = db.Exec(`INSERT INTO counters (id, n) VALUES ('hot', 0)`)
				require.NoError(t, err)
				return harness.Params{"url": url}
			},
			func(t testing.TB, p harness.Params) harness.Op {
				return op(testserver.Handle(t, testserver.MariaDBDriver, p["url"]).(testserver.MariaDBHandle))
			})
		var c counter
		require.NoError(t, db.Get(&c, `SELECT * FROM counters WHERE id = 'hot'`))
		t.Logf("successes %d, conflicts %d, errors %d, counter %d, version %d, p50 %v, p99 %v",
			res.Successes, res.Conflicts, res.Errors, c.N, c.Version, res.Percentile(.5), res.Percentile(.99))
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		require.Equal(t, 3*16*4, res.Successes)
		return res, c
	}
	t.Run("store", func(t *testing.T) {
		res, c := run(t, func(h testserver.MariaDBHandle) harness.Op {
			s, err := optimistic.NewStore[counter](h, optimistic.Config{Table: "counters", Retry: bigBudget})
			require.NoError(t, err)
			return func(ctx context.Context, key string) error {
				_, err := s.Update(ctx, key, func(c *counter) error { c.N++; return nil })
				return err
			}
		})
		require.EqualValues(t, res.Successes, c.N, "lost updates")
		require.EqualValues(t, res.Successes, c.Version, "one version per write")
	})
	t.Run("naive_control", func(t *testing.T) {
		res, c := run(t, func(h testserver.MariaDBHandle) harness.Op {
			return func(ctx context.Context, key string) error {
				var n int64
				if err := h.DB.QueryRowContext(ctx, `SELECT n FROM counters WHERE id = ?`, key).Scan(&n); err != nil {
					return err
				}
				_, err := h.DB.ExecContext(ctx, `UPDATE counters SET n = ? WHERE id = ?`, n+1, key)
				return err
			}
		})
		require.Less(t, c.N, int64(res.Successes), "the unchecked read-modify-write lost no update: the load is too weak to show anything")
	})
}

// A statement that waits for a row lock longer than
// innodb_lock_wait_timeout fails with 1205. Where the package owns the
// attempt it runs it again: the holder commits meanwhile, and the second
// attempt, reading the holder's write, goes through.
func TestLockWaitTimeoutIsRetriedOnMariaDB(t *testing.T) {
	t.Parallel()
	for _, subject := range []string{"guard", "store"} {
		t.Run(subject, func(t *testing.T) {
			t.Parallel()
			h := mariaSetup(t, "innodb_lock_wait_timeout=1")
			db := h.DB
			mariaAccounts(t, db, "a")
			ctx := t.Context()
			retried := make(chan contend.Event, 10)
			cfg := optimistic.Config{Table: "accounts", Retry: bigBudget, Observer: observerFunc(func(e contend.Event) {
				if e.Kind == contend.EventRetry {
					retried <- e
				}
			})}
			var do func() error
			if subject == "guard" {
				g, err := optimistic.NewGuard(h, cfg)
				require.NoError(t, err)
				do = func() error { return g.Do(ctx, "a", mariaWithdraw(db, "a", 30)) }
			} else {
				s := accountStore(t, h, cfg)
				do = func() error {
					_, err := s.Update(ctx, "a", func(a *account) error { a.Balance -= 30; return nil })
					return err
				}
			}

			holder, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			defer holder.Rollback()
			_, err = holder.Exec(`UPDATE accounts SET balance = balance - 1, version = version + 1 WHERE id = 'a'`)
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- do() }()
			select {
			case e := <-retried:
				require.Equal(t, uint16(sqlerr.MySQLLockWaitTimeout), mysqlNumber(e.Err), "%v", e.Err)
			case err := <-done:
				t.Fatalf("the lock wait timeout ended the call: %v", err)
			}
			require.NoError(t, holder.Commit())
			require.NoError(t, <-done)
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 69, Version: 2}, mariaRow(t, db, "a"))
		})
	}
}

// observerFunc is a Config.Observer.
type observerFunc func(contend.Event)

func (f observerFunc) Observe(_ context.Context, e contend.Event) { f(e) }

// Two guards' fns update rows a and b in opposite orders, each waiting on
// its first run for the other's first write: MariaDB kills one transaction
// as a deadlock (1213), which the guard, owning it, runs again; both end
// applied once.
func TestGuardRetriesADeadlockOnMariaDB(t *testing.T) {
	t.Parallel()
	h := mariaSetup(t, "")
	db := h.DB
	mariaAccounts(t, db, "x", "y")
	_, err := db.Exec(`CREATE TABLE pair (id varchar(8) PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO pair (id) VALUES ('a'), ('b')`)
	require.NoError(t, err)
	g, err := optimistic.NewGuard(h, optimistic.Config{Table: "accounts", Retry: bigBudget})
	require.NoError(t, err)

	wrote := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var runs [2]atomic.Int32
	errs := make(chan error, 2)
	for i, rows := range [2][2]string{{"a", "b"}, {"b", "a"}} {
		key := []string{"x", "y"}[i]
		go func() {
			errs <- g.Do(t.Context(), key, func(ctx context.Context) error {
				run := runs[i].Add(1)
				q := contend.Querier(ctx, db)
				for j, row := range rows {
					if j == 1 && run == 1 {
						close(wrote[i])
						<-wrote[1-i]
					}
					if _, err := q.ExecContext(ctx, `UPDATE pair SET n = n + 1 WHERE id = ?`, row); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.EqualValues(t, 3, runs[0].Load()+runs[1].Load(), "one of the two ran again")
	var n []int
	require.NoError(t, db.Select(&n, `SELECT n FROM pair ORDER BY id`))
	require.Equal(t, []int{2, 2}, n, "each fn applied once")
}

package atomic_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
)

// The tests of this file run on MariaDB, through go-sql-driver/mysql.

const mariaDecrement = "UPDATE products SET stock = stock - 1 WHERE id = ? AND stock >= 1"

// mariaProducts creates the products table on MariaDB, stock never below
// zero (CHECK constraints are enforced since MariaDB 10.2), so that an
// oversell shows up as errors rather than passing silently.
func mariaProducts(t testing.TB, db *sqlx.DB, stock int, ids ...string) {
	t.Helper()
	_, err := db.Exec("CREATE TABLE products (id varchar(64) PRIMARY KEY, stock bigint NOT NULL CHECK (stock >= 0))")
	require.NoError(t, err)
	for _, id := range ids {
		_, err := db.Exec("INSERT INTO products (id, stock) VALUES (?, ?)", id, stock)
		require.NoError(t, err)
	}
}

func mariaStock(t testing.TB, db *sqlx.DB, id string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, "SELECT stock FROM products WHERE id = ?", id))
	return n
}

// mariaBots is the bot table of the "start bot" story on MariaDB: the
// lease is a DATETIME(6) in UTC.
func mariaBots(t testing.TB, db *sqlx.DB, ids ...string) {
	t.Helper()
	_, err := db.Exec("CREATE TABLE bots (id varchar(191) PRIMARY KEY, engine_id varchar(64), lease_until datetime(6))")
	require.NoError(t, err)
	for _, id := range ids {
		_, err := db.Exec("INSERT INTO bots (id) VALUES (?)", id)
		require.NoError(t, err)
	}
}

func mariaOwner(t testing.TB, db *sqlx.DB, id string) *string {
	t.Helper()
	var owner *string
	require.NoError(t, db.Get(&owner, "SELECT engine_id FROM bots WHERE id = ?", id))
	return owner
}

// mariaSetup returns the test's own pool on a database of its own, and the
// handle the library is given: the pool wrapped by mysqldb.Wrap.
func mariaSetup(t *testing.T) (*sqlx.DB, contend.DB) {
	t.Helper()
	h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
	return h.DB, h
}

func TestUpdateOnMariaDB(t *testing.T) {
	t.Parallel()
	db, h := mariaSetup(t)
	mariaProducts(t, db, 2, "p")
	ctx := t.Context()

	applied, err := atomic.Update(ctx, h, mariaDecrement, "p")
	require.NoError(t, err)
	require.True(t, applied)

	// No UPDATE ... RETURNING on MySQL: the read-back runs in the update's
	// transaction.
	left := -1
	applied, err = atomic.UpdateSelect(ctx, h, []any{&left}, mariaDecrement, []any{"p"},
		"SELECT stock FROM products WHERE id = ?", "p")
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, 0, left)

	left = -1
	applied, err = atomic.UpdateSelect(ctx, h, []any{&left}, mariaDecrement, []any{"p"},
		"SELECT stock FROM products WHERE id = ?", "p")
	require.NoError(t, err)
	require.False(t, applied, "sold out is a lost race, not an error")
	require.Equal(t, -1, left, "dest is untouched when nothing applied")
	applied, err = atomic.Update(ctx, h, mariaDecrement, "p")
	require.NoError(t, err)
	require.False(t, applied)
	require.Equal(t, 0, mariaStock(t, db, "p"))

	_, err = atomic.Update(ctx, h, "UPDATE nosuchtable SET x = 1")
	require.Error(t, err, "backend errors are returned, not taken for a lost race")
}

// The affected-rows trap: by default go-sql-driver/mysql reports the rows
// an UPDATE changed, so an update that writes what the row holds reports 0
// and a win reads as a lost race. The handle the tests use sets
// clientFoundRows; Update then reports it applied.
func TestUpdateThatChangesNothingIsApplied(t *testing.T) {
	t.Parallel()
	db, h := mariaSetup(t)
	mariaProducts(t, db, 5, "p")
	applied, err := atomic.Update(t.Context(), h, "UPDATE products SET stock = ? WHERE id = ? AND stock >= 1", 5, "p")
	require.NoError(t, err)
	require.True(t, applied, "the row matched: the update applied, though it changed nothing")
}

// 32 goroutines in each of 3 processes decrement one hot row of stock 300
// on MariaDB: exactly 300 succeed and the stock ends at 0. The naive
// read-check-write under a sync.Mutex per process, the negative control,
// sells more than it takes from the stock.
func TestUpdateUnderContentionOnMariaDB(t *testing.T) {
	const stock = 300
	cfg := harness.Config{Processes: 3, Goroutines: 32, Ops: 4} // 384 attempts
	run := func(t *testing.T, op func(h testserver.MariaDBHandle) harness.Op) (harness.Result, *sqlx.DB) {
		var db *sqlx.DB
		res := harness.Run(t, cfg,
			func() harness.Params {
				url := testserver.MariaDB(t)
				db = testserver.Open(t, testserver.MariaDBDriver, url)
				mariaProducts(t, db, stock, "hot")
				return harness.Params{"url": url}
			},
			func(t testing.TB, p harness.Params) harness.Op {
				return op(testserver.Handle(t, testserver.MariaDBDriver, p["url"]).(testserver.MariaDBHandle))
			})
		t.Logf("sold %d, sold out %d, errors %d, p50 %v, p99 %v", res.Successes, res.Conflicts, res.Errors, res.Percentile(.5), res.Percentile(.99))
		return res, db
	}
	t.Run("atomic", func(t *testing.T) {
		res, db := run(t, func(h testserver.MariaDBHandle) harness.Op {
			return func(ctx context.Context, key string) error {
				applied, err := atomic.Update(ctx, h, mariaDecrement, key)
				if err == nil && !applied {
					err = fmt.Errorf("sold out: %w", contend.ErrConflict)
				}
				return err
			}
		})
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		require.Equal(t, stock, res.Successes)
		require.Equal(t, 3*32*4-stock, res.Conflicts)
		require.Equal(t, 0, mariaStock(t, db, "hot"))
	})
	t.Run("naive_control", func(t *testing.T) {
		res, db := run(t, func(h testserver.MariaDBHandle) harness.Op {
			var mu sync.Mutex // the process's own: keeps nothing apart across processes
			return func(ctx context.Context, key string) error {
				mu.Lock()
				defer mu.Unlock()
				var n int
				if err := h.DB.GetContext(ctx, &n, "SELECT stock FROM products WHERE id = ?", key); err != nil {
					return err
				}
				if n < 1 {
					return fmt.Errorf("sold out: %w", contend.ErrConflict)
				}
				time.Sleep(time.Millisecond) // the window another process sells in
				_, err := h.DB.ExecContext(ctx, "UPDATE products SET stock = ? WHERE id = ?", n-1, key)
				return err
			}
		})
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		require.Greater(t, res.Successes, stock-mariaStock(t, db, "hot"),
			"the naive control sold no more than the stock shows: the test cannot see a lost update")
	})
}

func TestClaimerIsAGuardOnMariaDB(t *testing.T) {
	for name, cfg := range map[string]atomic.ClaimerConfig{"plain": plain, "leased": longLeased} {
		t.Run(name, func(t *testing.T) { claimerSuite(t, testserver.MariaDBDriver, mariaBots, cfg) })
	}
}

func TestClaimReleaseOnMariaDB(t *testing.T) {
	t.Parallel()
	db, h := mariaSetup(t)
	mariaBots(t, db, "bot-1")
	c := claimer(t, h, plain)
	ctx := t.Context()

	token, err := c.Claim(ctx, "bot-1")
	require.NoError(t, err)
	require.Equal(t, token, *mariaOwner(t, db, "bot-1"))
	_, err = c.Claim(ctx, "bot-1")
	require.ErrorIs(t, err, contend.ErrConflict)
	require.NotErrorIs(t, err, contend.ErrNotFound)

	released, err := c.Release(ctx, "bot-1", "not-the-token")
	require.NoError(t, err)
	require.False(t, released)
	released, err = c.Release(ctx, "bot-1", token)
	require.NoError(t, err)
	require.True(t, released)
	require.Nil(t, mariaOwner(t, db, "bot-1"))
	released, err = c.Release(ctx, "bot-1", token)
	require.NoError(t, err)
	require.False(t, released, "a second release reports false")

	// A late release does not clear a newer claim.
	newer, err := c.Claim(ctx, "bot-1")
	require.NoError(t, err)
	released, err = c.Release(ctx, "bot-1", token)
	require.NoError(t, err)
	require.False(t, released)
	require.Equal(t, newer, *mariaOwner(t, db, "bot-1"))

	_, err = c.Claim(ctx, "ghost")
	require.ErrorIs(t, err, contend.ErrNotFound)
	require.NotErrorIs(t, err, contend.ErrConflict)
	// Keys are values, never SQL.
	_, err = c.Claim(ctx, "bot-1' OR '1'='1")
	require.ErrorIs(t, err, contend.ErrNotFound)
}

// The lease is kept by the database's clock: the deadline is the server's
// UTC time plus the lease, whatever the session's time zone, and a claim
// whose deadline passed is taken over and not revived.
func TestLeaseOnMariaDB(t *testing.T) {
	t.Parallel()
	url := testserver.MariaDB(t)
	db := testserver.Open(t, testserver.MariaDBDriver, url)
	mariaBots(t, db, "bot")
	// The claimer's sessions are five hours from UTC: a deadline in their
	// local time would be five hours off.
	h := testserver.Handle(t, testserver.MariaDBDriver, url+"?time_zone=%27%2B05%3A00%27")
	c := claimer(t, h, atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: time.Hour})
	ctx := t.Context()

	old, err := c.Claim(ctx, "bot")
	require.NoError(t, err)
	var until, now time.Time
	require.NoError(t, db.QueryRow("SELECT lease_until, UTC_TIMESTAMP(6) FROM bots WHERE id = 'bot'").Scan(&until, &now))
	require.WithinDuration(t, now.Add(time.Hour), until, time.Minute)
	_, err = c.Claim(ctx, "bot")
	require.ErrorIs(t, err, contend.ErrConflict, "an unexpired lease holds")
	extended, err := c.Extend(ctx, "bot", old)
	require.NoError(t, err)
	require.True(t, extended)

	// The holder crashed an hour ago: move its deadline into the past.
	_, err = db.Exec("UPDATE bots SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = 'bot'")
	require.NoError(t, err)
	extended, err = c.Extend(ctx, "bot", old)
	require.NoError(t, err)
	require.False(t, extended, "an expired claim is not revived")
	newer, err := c.Claim(ctx, "bot")
	require.NoError(t, err)
	released, err := c.Release(ctx, "bot", old)
	require.NoError(t, err)
	require.False(t, released, "the old holder's release must fail")
	require.Equal(t, newer, *mariaOwner(t, db, "bot"))
}

// 32 goroutines in each of 3 processes claim the same key, round after
// round: exactly one claim wins each round. The naive claim (read the
// owner, write it when empty), the negative control, lets several win.
func TestClaimUnderContentionOnMariaDB(t *testing.T) {
	const rounds = 10
	keys := make([]string, rounds)
	for i := range keys {
		keys[i] = "bot-" + strconv.Itoa(i)
	}
	cfg := harness.Config{Processes: 3, Goroutines: 32, Ops: rounds, Keys: keys}
	run := func(t *testing.T, op func(t testing.TB, h testserver.MariaDBHandle) harness.Op) harness.Result {
		return harness.Run(t, cfg,
			func() harness.Params {
				url := testserver.MariaDB(t)
				mariaBots(t, testserver.Open(t, testserver.MariaDBDriver, url), keys...)
				return harness.Params{"url": url}
			},
			func(t testing.TB, p harness.Params) harness.Op {
				return op(t, testserver.Handle(t, testserver.MariaDBDriver, p["url"]).(testserver.MariaDBHandle))
			})
	}
	t.Run("claimer", func(t *testing.T) {
		res := run(t, func(t testing.TB, h testserver.MariaDBHandle) harness.Op {
			c := claimer(t, h, plain)
			return func(ctx context.Context, key string) error {
				_, err := c.Claim(ctx, key)
				return err
			}
		})
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		for _, k := range keys {
			require.Equal(t, 1, res.PerKey[k].Successes, "round %s", k)
			require.Equal(t, 3*32-1, res.PerKey[k].Conflicts, "round %s", k)
		}
	})
	t.Run("naive_control", func(t *testing.T) {
		res := run(t, func(t testing.TB, h testserver.MariaDBHandle) harness.Op {
			return func(ctx context.Context, key string) error {
				var owner *string
				if err := h.DB.GetContext(ctx, &owner, "SELECT engine_id FROM bots WHERE id = ?", key); err != nil {
					return err
				}
				if owner != nil {
					return contend.ErrConflict
				}
				time.Sleep(time.Millisecond)
				_, err := h.DB.ExecContext(ctx, "UPDATE bots SET engine_id = ? WHERE id = ?", "x", key)
				return err
			}
		})
		require.Zero(t, res.Errors, "%v", res.FirstErrors)
		require.Greater(t, res.Successes, rounds, "the naive claim let one winner a round: the test cannot see a double start")
	})
}

// Names are quoted with backquotes: reserved words work as names, and a
// name that would end the quoting is refused, never escaped.
func TestClaimerQuotesNamesOnMariaDB(t *testing.T) {
	t.Parallel()
	db, h := mariaSetup(t)
	_, err := db.Exec("CREATE TABLE `order` (`key` varchar(64) PRIMARY KEY, `select` varchar(64), `from` datetime(6))")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO `order` (`key`) VALUES ('k')")
	require.NoError(t, err)
	c := claimer(t, h, atomic.ClaimerConfig{Table: "order", KeyColumn: "key", OwnerColumn: "select", LeaseColumn: "from"})
	require.NoError(t, c.Do(t.Context(), "k", func(context.Context) error { return nil }))

	ctx := t.Context()
	for name, cfg := range map[string]atomic.ClaimerConfig{
		"backquote in table":  {Table: "bots`; DROP TABLE products; --", OwnerColumn: "engine_id"},
		"backquote in column": {Table: "order", OwnerColumn: "select` = NULL, `key"},
		"double quote":        {Table: `order"`, OwnerColumn: "select"},
		"three-part name":     {Table: "a.b.order", OwnerColumn: "select"},
		"negative lease":      {Table: "order", OwnerColumn: "select", LeaseColumn: "from", Lease: -time.Second},
	} {
		_, err := atomic.NewClaimer(h, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	missing := claimer(t, h, atomic.ClaimerConfig{Table: "nosuchtable"})
	_, err = missing.Claim(ctx, "k")
	require.ErrorContains(t, err, "nosuchtable", "a missing table fails at the first call")
	var n int
	require.NoError(t, db.Get(&n, "SELECT count(*) FROM `order`"), "the injection attempts reached nothing")
}

// A pool of go-sql-driver/mysql passed without mysqldb.Wrap is refused, so
// that it never runs PostgreSQL's statements or counts rows changed.
func TestBareMariaDBHandleIsRefused(t *testing.T) {
	t.Parallel()
	db, _ := mariaSetup(t)
	mariaProducts(t, db, 1, "p")
	ctx := t.Context()
	_, err := atomic.Update(ctx, db, mariaDecrement, "p")
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.ErrorContains(t, err, "mysqldb.Wrap")
	_, err = atomic.Update(ctx, db.DB, mariaDecrement, "p")
	require.ErrorIs(t, err, contend.ErrInvalid)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = atomic.NewClaimer(conn, plain)
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.Equal(t, 1, mariaStock(t, db, "p"), "nothing ran")

	// Wrapped, the connection works.
	applied, err := atomic.Update(ctx, mysqldb.Wrap(conn), mariaDecrement, "p")
	require.NoError(t, err)
	require.True(t, applied)
	require.False(t, errors.Is(err, contend.ErrInvalid))
}

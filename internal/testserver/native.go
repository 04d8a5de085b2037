package testserver

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/mysqldb"
	"github.com/contend/contend/pgxdb"
)

// PgxNative names the third driver the SQL strategies support: pgx's native
// interface, a *pgxpool.Pool wrapped by pgxdb.Wrap. It is no database/sql
// driver: [Open] gives a test's own statements on it the pgx stdlib driver,
// and [Handle] gives the subject the native pool.
const PgxNative = "pgx-native"

// AllDrivers lists every driver the SQL strategies support: [Drivers] and
// [PgxNative]. Tests that build a subject with [Handle] run against each.
var AllDrivers = []string{"postgres", "pgx", PgxNative}

// PathDrivers lists one driver per code path of the SQL strategies:
// database/sql (lib/pq) and pgx native. lib/pq and pgx's stdlib driver run
// the same library code and differ in what the light tests and the fault
// suite check (errors, cancellation), so the heavy contention tests run on
// these two, to keep the test run short.
var PathDrivers = []string{"postgres", PgxNative}

// sqlDriver returns the database/sql driver for a test's own statements
// under driver.
func sqlDriver(driver string) string {
	if driver == PgxNative {
		return "pgx"
	}
	return driver
}

// Native is a wrapped pgx pool that still knows its pool, so that a test's
// fn can ask [pgxdb.Querier] for the guard's transaction, as an
// application would with the pool it keeps.
type Native struct {
	sqldb.Wrapped
	Pool *pgxpool.Pool
}

// Handle opens url through driver, at most [MaxConns] connections, and
// returns what a subject is built on: the *sqlx.DB [Open] returns, under
// [PgxNative] a [Native] pool, under [MariaDBDriver] a [MariaDBHandle]. It is closed when t ends.
func Handle(t testing.TB, driver, url string) contend.DB {
	t.Helper()
	switch driver {
	case PgxNative:
		return OpenNative(t, url)
	case MariaDBDriver:
		return openMariaDBHandle(t, url)
	}
	return Open(t, driver, url)
}

// OpenNative opens a pgx pool on url, at most [MaxConns] connections,
// wrapped for the strategies; it is closed when t ends.
func OpenNative(t testing.TB, url string) Native {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = MaxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("testserver: connect %s: %v", PgxNative, err)
	}
	return Native{pgxdb.Wrap(pool).(sqldb.Wrapped), pool}
}

// Querier returns the querier a guard's fn runs its statements on, for a
// subject built on db: [contend.Querier] on a database/sql handle,
// [pgxdb.Querier] on a [Native] one, behind one interface so that one fn
// body serves every driver.
func Querier(ctx context.Context, db contend.DB) sqldb.Querier {
	var q contend.DB
	switch h := db.(type) {
	case Native:
		q = pgxdb.Wrap(pgxdb.Querier(ctx, h.Pool))
	case MariaDBHandle:
		return mariaDBQuerier(ctx, h)
	case contend.DBTX:
		q = contend.Querier(ctx, h)
	default:
		panic(fmt.Sprintf("testserver: Querier of a %T", db))
	}
	d, err := sqldb.Statements(q)
	if err != nil {
		panic(fmt.Sprintf("testserver: Querier: %v", err))
	}
	return d
}

// Session returns one connection of h, a handle [Handle] opened under
// driver, as a subject would be built on it: a *sql.Conn, under
// [PgxNative] a [Native] whose handle is a wrapped *pgx.Conn, under
// [MariaDBDriver] a [MariaDBHandle] whose handle is a wrapped *sql.Conn.
// [Querier] works on it as on h. The connection goes back when t ends.
func Session(t testing.TB, h contend.DB) contend.DB {
	t.Helper()
	ctx := context.Background()
	switch h := h.(type) {
	case Native:
		c, err := h.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return Native{pgxdb.Wrap(c.Conn()).(sqldb.Wrapped), h.Pool}
	case MariaDBHandle:
		c, err := h.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return MariaDBHandle{mysqldb.Wrap(c).(sqldb.Wrapped), h.DB}
	case *sqlx.DB:
		c, err := h.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	t.Fatalf("testserver: Session of a %T", h)
	return nil
}

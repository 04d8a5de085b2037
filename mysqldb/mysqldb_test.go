package mysqldb_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// setup returns a mysql:// URL of a database of the test's own, with one
// product row "p" of stock 5.
func setup(t *testing.T) string {
	t.Helper()
	url := testserver.MariaDB(t)
	db := testserver.Open(t, testserver.MariaDBDriver, url)
	_, err := db.Exec("CREATE TABLE products (id varchar(64) PRIMARY KEY, stock int NOT NULL)")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO products VALUES ('p', 5)")
	require.NoError(t, err)
	return url
}

// open opens url's database with clientFoundRows as given.
func open(t *testing.T, url string, foundRows bool) *sql.DB {
	t.Helper()
	cfg, err := testserver.MariaDBConfig(url)
	require.NoError(t, err)
	cfg.ClientFoundRows = foundRows
	var db *sql.DB
	if foundRows {
		db, err = mysqldb.Open(cfg)
	} else {
		db, err = sql.Open("mysql", cfg.FormatDSN())
	}
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// An update that writes what the row holds: it matches one row and
// changes none.
const sameStock = "UPDATE products SET stock = 5 WHERE id = ?"

// Without clientFoundRows the driver counts rows changed, so the update
// above reads as a lost race. Wrap refuses such a handle, pool or
// transaction, rather than let a won race read as lost.
func TestWrapRefusesAHandleThatCountsRowsChanged(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := t.Context()
	db := open(t, url, false)

	// The trap itself, so that this test fails if the driver changes.
	res, err := db.ExecContext(ctx, sameStock, "p")
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.Zero(t, n, "without clientFoundRows the driver reports rows changed")

	_, err = atomic.Update(ctx, mysqldb.Wrap(db), sameStock, "p")
	require.ErrorIs(t, err, mysqldb.ErrAffectedRows)
	require.ErrorIs(t, err, contend.ErrInvalid)
	c, err := atomic.NewClaimer(mysqldb.Wrap(db), atomic.ClaimerConfig{Table: "products", OwnerColumn: "stock"})
	require.NoError(t, err, "no I/O at construction")
	_, err = c.Claim(ctx, "p")
	require.ErrorIs(t, err, mysqldb.ErrAffectedRows, "the first call checks")
	require.NoError(t, c.Close(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = atomic.Update(ctx, mysqldb.Wrap(tx), sameStock, "p")
	require.ErrorIs(t, err, mysqldb.ErrAffectedRows)

	// Open sets it; the same update is then a win.
	good := mysqldb.Wrap(open(t, url, true))
	for range 2 { // the second call uses the check's remembered answer
		applied, err := atomic.Update(ctx, good, sameStock, "p")
		require.NoError(t, err)
		require.True(t, applied)
	}
}

func TestWrapRefusesWhatItCannotUse(t *testing.T) {
	t.Parallel()
	var nilDB *sql.DB
	pg := testserver.Open(t, "pgx", testserver.Postgres(t))
	for name, h := range map[string]contend.DBTX{"nil": nil, "nil pool": nilDB, "PostgreSQL pool": pg} {
		_, err := atomic.Update(t.Context(), mysqldb.Wrap(h), "UPDATE products SET stock = 1")
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err := mysqldb.Open(nil)
	require.ErrorIs(t, err, contend.ErrInvalid)
}

// A guard's fn reaches the guard's transaction through contend.Querier on
// the pool, as on PostgreSQL.
func TestQuerierIsTheGuardsTransaction(t *testing.T) {
	t.Parallel()
	url := setup(t)
	db := open(t, url, true)
	_, err := db.Exec("CREATE TABLE bots (id varchar(64) PRIMARY KEY, owner varchar(64))")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO bots VALUES ('b', NULL)")
	require.NoError(t, err)
	ctx := t.Context()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	c, err := atomic.NewClaimer(mysqldb.Wrap(db), atomic.ClaimerConfig{Table: "bots"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(ctx)) }()
	// The claim joins the transaction ctx carries: rolled back, it leaves
	// nothing behind.
	err = c.Do(contend.WithQuerier(ctx, tx), "b", func(ctx context.Context) error {
		q := contend.Querier(ctx, db)
		require.Same(t, tx, q, "fn runs in the transaction ctx carries")
		var owner sql.NullString
		require.NoError(t, q.QueryRowContext(ctx, "SELECT owner FROM bots WHERE id = 'b'").Scan(&owner))
		require.True(t, owner.Valid, "the claim is visible inside its transaction")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	var owner sql.NullString
	require.NoError(t, db.QueryRow("SELECT owner FROM bots WHERE id = 'b'").Scan(&owner))
	require.False(t, owner.Valid)
}

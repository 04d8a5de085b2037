package testserver

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An owned server restarts on its port with its data, and a pool that had
// connections to it works again after the restart.
func TestOwnPostgresRestarts(t *testing.T) {
	t.Parallel()
	pg := OwnPostgres(t)
	db, err := sql.Open("pgx", pg.URL())
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE t (n int); INSERT INTO t VALUES (7)`)
	require.NoError(t, err)
	addr := pg.Addr()

	require.NoError(t, pg.Restart())
	require.Equal(t, addr, pg.Addr())
	var n int
	require.Eventually(t, func() bool { return db.QueryRow(`SELECT n FROM t`).Scan(&n) == nil }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 7, n, "the data survived")

	require.NoError(t, pg.Stop())
	require.False(t, pg.Running())
	require.Error(t, db.Ping())
}

// An owned MariaDB starts with the read-only settings it was given, serves
// its database "test", and is gone once stopped.
func TestOwnMariaDBTakesReadOnlySettings(t *testing.T) {
	t.Parallel()
	began := time.Now()
	m := OwnMariaDB(t, "--innodb-rollback-on-timeout=ON", "--innodb-lock-wait-timeout=1")
	t.Logf("initialised and started in %v", time.Since(began))
	db := Open(t, MariaDBDriver, m.URL())
	var rollback, wait int
	require.NoError(t, db.QueryRow(`SELECT @@innodb_rollback_on_timeout, @@innodb_lock_wait_timeout`).Scan(&rollback, &wait))
	require.Equal(t, 1, rollback)
	require.Equal(t, 1, wait)
	_, err := db.Exec(`CREATE TABLE t (n int)`)
	require.NoError(t, err)

	require.NoError(t, m.Stop())
	require.False(t, m.Running())
	require.Error(t, db.Ping())
}

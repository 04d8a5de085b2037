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

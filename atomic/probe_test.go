package atomic_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/testserver"
)

// A claim that waits for the row lock of a transaction that deletes the
// row answers ErrNotFound once that transaction commits: the row is gone,
// not held. Its statement began while the row was there, so what it read
// at its start cannot say so; nor can a caller's REPEATABLE READ
// transaction that the claim runs in (MariaDB's default isolation), whose
// snapshot was taken before the delete. On PostgreSQL that transaction
// cannot go on at all: the claim answers the server's serialization
// failure, for the caller to run its transaction again.
func TestClaimOfARowDeletedWhileItWaitedIsNotFound(t *testing.T) {
	t.Parallel()
	drivers := append([]string{testserver.MariaDBDriver}, testserver.Drivers...)
	for _, driver := range drivers {
		for name, cfg := range map[string]atomic.ClaimerConfig{"plain": plain, "leased": leased} {
			for _, inTx := range []bool{false, true} {
				name := driver + "/" + name
				if inTx {
					name += "/in-a-repeatable-read-transaction"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					claimOfADeletedRow(t, driver, cfg, inTx)
				})
			}
		}
	}
}

func claimOfADeletedRow(t *testing.T, driver string, cfg atomic.ClaimerConfig, inTx bool) {
	h := testserver.Handle(t, driver, testserver.URL(t, driver))
	db, _ := h.(*sqlx.DB)
	// waiting reports whether a session waits for a lock of the session
	// whose id is id.
	selfID := "SELECT pg_backend_pid()"
	waiting := "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))"
	if driver == testserver.MariaDBDriver {
		db = h.(testserver.MariaDBHandle).DB
		mariaBots(t, db, "bot")
		selfID = "SELECT CONNECTION_ID()"
		// The claim's UPDATE, the only one in the test's own database, has
		// been running a while: it waits for the lock. (INNODB_TRX leaves
		// transactions out on a busy server.)
		waiting = `SELECT ? > 0 AND EXISTS (SELECT 1 FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE 'UPDATE%' AND STATE = 'Updating' AND TIME_MS > 100)`
	} else {
		bots(t, db, "bot")
	}
	c := claimer(t, h, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	claimCtx := ctx
	if inTx {
		// The caller's transaction reads before the delete: its snapshot
		// has the row.
		caller, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		defer caller.Rollback()
		var n int
		require.NoError(t, caller.GetContext(ctx, &n, db.Rebind("SELECT COUNT(*) FROM bots WHERE id = ?"), "bot"))
		require.Equal(t, 1, n)
		claimCtx = contend.WithQuerier(ctx, caller)
	}

	del, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer del.Rollback()
	var id int64
	require.NoError(t, del.QueryRowContext(ctx, selfID).Scan(&id))
	_, err = del.ExecContext(ctx, "DELETE FROM bots WHERE id = 'bot'")
	require.NoError(t, err)

	claimed := make(chan error, 1)
	go func() {
		_, err := c.Claim(claimCtx, "bot")
		claimed <- err
	}()
	// The claim waits for the deleter's row lock.
	if !assert.Eventually(t, func() bool {
		var w bool
		return db.QueryRowContext(ctx, waiting, id).Scan(&w) == nil && w
	}, 15*time.Second, 10*time.Millisecond, "the claim never waited for the deleter's lock") {
		// The claim returns before the test does, and its claimer closes.
		_ = del.Rollback()
		<-claimed
		t.FailNow()
	}
	require.NoError(t, del.Commit())

	err = <-claimed
	t.Logf("the claim answered: %v", err)
	require.NotErrorIs(t, err, contend.ErrConflict, "a row deleted is taken for a row held")
	if inTx && driver != testserver.MariaDBDriver {
		// The row the transaction sees is gone: PostgreSQL refuses to go on
		// (as MariaDB does with innodb_snapshot_isolation on), and the
		// caller runs its transaction again, where the claim finds no row.
		require.True(t, sqlerr.Is(err, sqlerr.SerializationFailure), "%v", err)
		return
	}
	require.ErrorIs(t, err, contend.ErrNotFound)
}

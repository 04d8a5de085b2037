package sqlerr_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/sqlerr"
	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// Each driver's real errors, produced by a real server, classify the same.
func TestClassifiesBothDrivers(t *testing.T) {
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			ctx := t.Context()
			_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)`)
			require.NoError(t, err)

			_, err = db.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
			require.Equal(t, sqlerr.UniqueViolation, sqlerr.Code(err))
			wrapped := fmt.Errorf("outer: %w", err)
			require.True(t, sqlerr.Is(wrapped, sqlerr.UniqueViolation), "wrapped errors classify too")
			require.False(t, sqlerr.Retryable(err))

			holder, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			defer holder.Rollback()
			_, err = holder.ExecContext(ctx, `SELECT * FROM t WHERE id = 1 FOR UPDATE`)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, `SELECT * FROM t WHERE id = 1 FOR UPDATE NOWAIT`)
			require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err))
			// SET LOCAL: a session-wide timeout would stay on the pooled
			// connection and cancel later tests' statements.
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `SET LOCAL statement_timeout = 50`)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `SELECT pg_sleep(1)`)
			require.Equal(t, sqlerr.QueryCanceled, sqlerr.Code(err))
			require.NoError(t, tx.Rollback())
			require.NoError(t, holder.Rollback())

			requireDeadlock(t, db.DB, ctx, `UPDATE t SET id = id WHERE id = $1`)
		})
	}
}

// Two transactions lock rows 1 and 2 in opposite orders, by update (which
// takes the row id given as its one argument); the server kills one.
func requireDeadlock(t *testing.T, db *sql.DB, ctx context.Context, update string) {
	t.Helper()
	txs := make([]*sql.Tx, 2)
	for i := range txs {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		_, err = tx.ExecContext(ctx, update, i+1)
		require.NoError(t, err)
		txs[i] = tx
	}
	errs := make(chan error, 2)
	for i, tx := range txs {
		go func() {
			_, err := tx.ExecContext(ctx, update, 2-i)
			if err != nil {
				// The victim's rollback releases its locks so the other
				// transaction can finish.
				tx.Rollback()
			}
			errs <- err
		}()
	}
	var victims []error
	for range txs {
		if err := <-errs; err != nil {
			victims = append(victims, err)
		}
	}
	require.Len(t, victims, 1, "exactly one transaction is the deadlock's victim: %v", victims)
	require.True(t, sqlerr.Retryable(victims[0]), "got %v", victims[0])
	require.Equal(t, sqlerr.DeadlockDetected, sqlerr.Code(victims[0]))
}

// MariaDB's errors, from the real server through go-sql-driver/mysql,
// classify as their PostgreSQL twins.
func TestClassifiesMariaDB(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, testserver.MariaDBDriver)
	ctx := t.Context()
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO t VALUES (1), (2)`)
	require.NoError(t, err)

	_, err = db.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	require.Equal(t, sqlerr.UniqueViolation, sqlerr.Code(err))
	n, ok := sqlerr.MySQLNumber(fmt.Errorf("outer: %w", errors.Join(errors.New("other"), err)))
	require.True(t, ok, "wrapped and joined errors classify too")
	require.EqualValues(t, sqlerr.MySQLDupEntry, n)
	require.False(t, sqlerr.Retryable(err))

	holder, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	_, err = holder.ExecContext(ctx, `SELECT * FROM t WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)
	// MariaDB's NOWAIT fails with the lock wait timeout's number (MySQL 8's
	// with 3572); a session's innodb_lock_wait_timeout ends a wait the same
	// way. Both are set per transaction's connection and reset with it.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SELECT * FROM t WHERE id = 1 FOR UPDATE NOWAIT`)
	require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err), "%v", err)
	_, err = conn.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `SELECT * FROM t WHERE id = 1 FOR UPDATE`)
	require.Equal(t, sqlerr.LockNotAvailable, sqlerr.Code(err), "%v", err)
	_, err = conn.ExecContext(ctx, `SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(1) FROM t`)
	require.Equal(t, sqlerr.QueryCanceled, sqlerr.Code(err), "%v", err)
	require.NoError(t, holder.Rollback())

	requireDeadlock(t, db.DB, ctx, `UPDATE t SET id = id WHERE id = ?`)
}

func TestNoCode(t *testing.T) {
	t.Parallel()
	require.Empty(t, sqlerr.Code(nil))
	require.Empty(t, sqlerr.Code(errors.New("plain")))
	require.False(t, sqlerr.Is(context.Canceled, sqlerr.QueryCanceled))
}

package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// scripted is a transaction's handle whose statements fail with the errors
// it is given, one per statement, and that counts what reached it. It
// stands for the server only in what the transaction's state is made of:
// which error a statement got.
type scripted struct {
	mu         sync.Mutex
	errs       []error
	reached    int
	rolledBack bool
}

func (s *scripted) next() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reached++
	if len(s.errs) == 0 {
		return nil
	}
	err := s.errs[0]
	s.errs = s.errs[1:]
	return err
}

func (s *scripted) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, s.next()
}

func (s *scripted) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, s.next()
}

func (s *scripted) QueryRowContext(context.Context, string, ...any) *sql.Row { panic("not scripted") }

func (s *scripted) Rollback() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rolledBack = true
	return nil
}

// A MySQL transaction dies with its first deadlock: no statement reaches
// the connection after it, the first cause is the one reported, and a
// duplicate key or a driver's own error leaves it alive. PostgreSQL's
// transactions are left to the server, which refuses them itself.
func TestDeadTransactionStaysDead(t *testing.T) {
	dup := &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	second := &mysql.MySQLError{Number: 1213, Message: "another deadlock"}
	other := errors.New("driver: bad connection")
	ctx := t.Context()

	s := &scripted{errs: []error{dup, other, nil, deadlock, second}}
	tx := &stdTx{stdQuerier: stdQuerier{db: s}, dialect: MySQL}
	for _, want := range []error{dup, other, nil, deadlock} {
		_, err := tx.ExecContext(ctx, "UPDATE t SET n = n + 1")
		if want == nil {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, want)
		}
	}
	require.ErrorIs(t, tx.Err(), deadlock)
	for range 3 {
		_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
		require.ErrorIs(t, err, deadlock, "a statement after the deadlock was not refused")
		_, err = tx.QueryContext(ctx, "SELECT 1")
		require.ErrorIs(t, err, deadlock)
	}
	require.Equal(t, 4, s.reached, "a statement reached the connection after the deadlock")
	require.False(t, s.rolledBack, "the *sql.Tx was ended before its owner or the session had done with it")
	EndDead(tx)
	require.True(t, s.rolledBack)

	pg := &stdTx{stdQuerier: stdQuerier{db: &scripted{errs: []error{deadlock}}}, dialect: Postgres}
	_, err := pg.ExecContext(ctx, "UPDATE t SET n = n + 1")
	require.ErrorIs(t, err, deadlock)
	require.NoError(t, pg.Err())
}

// Goroutines sharing a transaction (fn's, a nested guard's) agree on one
// death, the first, whatever the order their deadlocks arrive in.
func TestDeathIsOneValue(t *testing.T) {
	const goroutines = 8
	errs := make([]error, goroutines)
	for i := range errs {
		errs[i] = &mysql.MySQLError{Number: 1213, Message: "deadlock"}
	}
	s := &scripted{errs: errs}
	tx := &stdTx{stdQuerier: stdQuerier{db: s}, dialect: MySQL}
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() { _, _ = tx.ExecContext(t.Context(), "UPDATE t SET n = 1") })
	}
	wg.Wait()
	dead := tx.Err()
	require.Error(t, dead)
	var first *mysql.MySQLError
	require.ErrorAs(t, dead, &first)
	for range 3 {
		require.Equal(t, dead, tx.Err(), "the cause changed after the transaction died")
	}
}

// The classifier of a MySQL statement's error: a deadlock kills the
// transaction without asking; a duplicate key or an error that is not the
// server's leaves it alive without asking; any other server error asks
// whether the transaction is still open, and an answer that does not come
// (MySQL 8's 1193, unknown system variable @@in_transaction) kills it: the
// safe direction. A real MySQL 8 is not available to the tests; MariaDB's
// side is TestTimedOutLockTellsTheTruthWhenItRollsBack (pessimistic,
// optimistic), on a server started with innodb_rollback_on_timeout.
func TestMySQLErrorClassifier(t *testing.T) {
	timeout := &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}
	unknown := &mysql.MySQLError{Number: 1193, Message: "Unknown system variable 'in_transaction'"}
	for _, c := range []struct {
		name   string
		err    error
		open   bool
		askErr error
		asked  bool
		dead   bool
	}{
		{name: "deadlock", err: &mysql.MySQLError{Number: 1213}, dead: true},
		{name: "duplicate key", err: &mysql.MySQLError{Number: 1062}},
		{name: "driver's error", err: errors.New("driver: bad connection")},
		{name: "ctx's error", err: context.Canceled},
		{name: "timeout, transaction open", err: timeout, open: true, asked: true},
		{name: "timeout, rolled back", err: timeout, asked: true, dead: true},
		{name: "timeout, MySQL 8 cannot say", err: timeout, askErr: unknown, asked: true, dead: true},
		{name: "other error, ctx ended before asking", err: &mysql.MySQLError{Number: 1452}, askErr: context.DeadlineExceeded, asked: true, dead: true},
		{name: "other error, transaction open", err: &mysql.MySQLError{Number: 1452}, open: true, asked: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked := false
			cause, dead := mysqlRolledBack(c.err, func() (bool, error) { asked = true; return c.open, c.askErr })
			require.Equal(t, c.asked, asked, "asked the server")
			require.Equal(t, c.dead, dead)
			if !dead {
				require.NoError(t, cause)
				return
			}
			require.ErrorIs(t, cause, c.err)
			if c.askErr != nil {
				require.ErrorIs(t, cause, c.askErr)
				require.ErrorContains(t, cause, "unknown")
			}
		})
	}
}

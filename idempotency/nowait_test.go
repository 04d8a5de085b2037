package idempotency_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pgxdb"
)

// NoWait makes only the key's own wait fail at once: fn's statements run
// under the lock timeout they would have had, and the connection goes
// back to its pool with its setting, after an in-flight refusal too.
func TestNoWaitLeavesTheLockTimeoutAlone(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		show := `SELECT current_setting('lock_timeout')`
		if e.dialect == sqldb.MySQL {
			show = `SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR)`
		}
		// One connection, so that every call, and the check, share it.
		one := oneConn(t, e)
		var before string
		require.NoError(t, testserver.Querier(ctx, one).QueryRow(ctx, show).Scan(&before))
		s, err := idempotency.New(one, idempotency.Config{Table: "idem", NoWait: true})
		require.NoError(t, err)
		var inFn string
		_, _, err = s.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			err := testserver.Querier(ctx, one).QueryRow(ctx, show).Scan(&inFn)
			return []byte("a"), err
		})
		require.NoError(t, err)
		require.Equal(t, before, inFn, "fn runs under the lock timeout it would have had")

		// A key in flight in another transaction: refused at once.
		started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			_, _, err := e.store(t, idempotency.Config{}).Do(ctx, "held", "fp", func(context.Context) ([]byte, error) {
				close(started)
				<-release
				return nil, nil
			})
			done <- err
		}()
		<-started
		_, _, err = s.Do(ctx, "held", "fp", e.effect("held", "fp"))
		require.ErrorIs(t, err, idempotency.ErrInFlight)
		close(release)
		require.NoError(t, <-done)

		var after string
		require.NoError(t, testserver.Querier(ctx, one).QueryRow(ctx, show).Scan(&after))
		require.Equal(t, before, after, "the pooled connection keeps its setting")
	})
}

// oneConn opens e's database again through e's driver, as a pool of one
// connection.
func oneConn(t *testing.T, e *env) contend.DB {
	t.Helper()
	if e.driver == testserver.PgxNative {
		cfg, err := pgxpool.ParseConfig(e.url)
		require.NoError(t, err)
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return testserver.Native{Wrapped: pgxdb.Wrap(pool).(sqldb.Wrapped), Pool: pool}
	}
	h := testserver.Handle(t, e.driver, e.url)
	switch h := h.(type) {
	case testserver.MariaDBHandle:
		h.DB.SetMaxOpenConns(1)
	case interface{ SetMaxOpenConns(int) }:
		h.SetMaxOpenConns(1)
	default:
		t.Fatalf("oneConn: a %T", h)
	}
	return h
}

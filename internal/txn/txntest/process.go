package txntest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/testserver"
)

// holderEnv makes the test binary a holder process: it carries the driver,
// the URL and the key, separated by spaces.
const holderEnv = "CONTEND_TXNTEST_HOLDER"

// HolderDeadline is the holder process's ctx deadline: a stopped holder is
// resumed after it passed.
const HolderDeadline = time.Second

// hold is the holder process: it says "holding" once inside fn, after fn's
// write, and waits there until its ctx ends; then it says how its call
// ended.
func hold(t *testing.T, s Subject, orders string) {
	f := strings.Fields(orders)
	require.Len(t, f, 3)
	driver, url, key := f[0], f[1], f[2]
	op := s.New(t, testserver.Handle(t, driver, url), Finish)
	ctx, cancel := context.WithTimeout(context.Background(), HolderDeadline)
	defer cancel()
	err := op(ctx, key, addThen(postgres, key, func(ctx context.Context, _ sqldb.Querier) error {
		fmt.Println("holding")
		<-ctx.Done()
		return context.Cause(ctx)
	}))
	fmt.Printf("done %v\n", err)
}

// holder starts a holder process for key on url and waits until it is
// inside fn.
func holder(t *testing.T, driver, url, key string) *harness.Child {
	t.Helper()
	c := harness.StartChild(t, t.Name(), holderEnv+"="+driver+" "+url+" "+key)
	c.Next(t, "holding", 20*time.Second)
	return c
}

// holderScene makes key's row on the shared server, with sessions that end
// after IdleInTransaction idle in a transaction, and a pool to it.
func holderScene(t *testing.T, s Subject, driver string) (scene, string) {
	t.Helper()
	url := testserver.Postgres(t)
	_, proxied := Proxied(t, url) // for its URL's settings; the proxy stays healthy
	direct := testserver.Open(t, driver, url)
	key := newRow(t, direct, postgres) // before New: the claimer prepares on the table
	var h contend.DB = direct
	if driver == testserver.PgxNative {
		h = testserver.Handle(t, driver, url)
	}
	// The taker is not under faults: its commit is bounded by the
	// library's default, not by the faults' tight Finish, which a COMMIT's
	// fsync on a loaded machine can pass.
	return scene{direct: direct, op: s.New(t, h, takerFinish), key: key, sql: postgres}, proxied
}

// takerFinish is the taker's finish bound: the library's default.
const takerFinish = 5 * time.Second

// takeOver runs the subject for the key until it gets in, trying again after
// a conflict, and returns when it did.
func takeOver(t *testing.T, sc scene, limit time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	for {
		err := sc.op(ctx, sc.key, func(ctx context.Context, q sqldb.Querier) error {
			if q != nil {
				return sc.sql.add(ctx, q, sc.key)
			}
			return nil
		})
		if !errors.Is(err, contend.ErrConflict) {
			return time.Now(), err
		}
		select {
		case <-ctx.Done():
			return time.Now(), err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// wrote is what the key's counter must say once the holder and the taker
// are done: the taker's write, and the holder's only when it escapes the
// guard's transaction (the claimer's fn writes straight to the pool).
func wrote(s Subject, sc scene) int {
	if s.Transactional {
		return 1
	}
	return 2
}

// SIGKILL of the holder inside fn: its connection closes with the process,
// so the server rolls its transaction back and lets go at once; a claim
// stays until its lease passes.
func killed(t *testing.T, s Subject, driver string) {
	sc, url := holderScene(t, s, driver)
	cmd := holder(t, driver, url, sc.key).Cmd
	got := make(chan time.Time, 1)
	var terr error
	go func() {
		at, err := takeOver(t, sc, 10*time.Second)
		terr = err
		got <- at
	}()
	time.Sleep(100 * time.Millisecond) // the taker queues, or meets the claim
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killedAt := time.Now()
	at := <-got
	require.NoError(t, terr)
	after := at.Sub(killedAt)
	t.Logf("%s: taken over %v after the kill", driver, after.Round(time.Millisecond))
	require.Less(t, after, s.Lease+time.Second)
	require.Equal(t, wrote(s, sc), count(t, sc), "the dead holder's uncommitted write is gone")
}

// SIGSTOP of the holder inside fn, past its ctx's deadline, then SIGCONT:
// the frozen holder's session sits idle in its transaction, which the
// server ends after idle_in_transaction_session_timeout (a claim: after its
// lease), so the key is taken over while the holder is still stopped. Once
// resumed, the holder learns its call failed.
func stopped(t *testing.T, s Subject, driver string) {
	sc, url := holderScene(t, s, driver)
	h := holder(t, driver, url, sc.key)
	cmd := h.Cmd
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stoppedAt := time.Now()
	const resumeAfter = 3 * time.Second
	at, err := takeOver(t, sc, resumeAfter)
	require.NoError(t, err, "the key was not taken over while the holder was stopped")
	t.Logf("%s: taken over %v after the stop", driver, at.Sub(stoppedAt).Round(time.Millisecond))
	time.Sleep(time.Until(stoppedAt.Add(HolderDeadline + 200*time.Millisecond)))
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	done := h.Next(t, "done ", 20*time.Second)
	t.Logf("%s: the resumed holder's call returned: %s", driver, done)
	require.NotEqual(t, "<nil>", done, "the resumed holder believed it succeeded")
	require.Equal(t, wrote(s, sc), count(t, sc))
}

// restarted: the server restarts while fn runs. Its transaction is rolled
// back; fn's next statement fails; the call returns that error; the pool
// works again after.
func restarted(t *testing.T, s Subject, pg *testserver.OwnedPostgres, driver string) {
	direct := testserver.Open(t, driver, pg.URL())
	key := newRow(t, direct, postgres)
	sc := scene{direct: direct, op: s.New(t, testserver.Handle(t, driver, pg.URL()), Finish), key: key, sql: postgres}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	o := run(t, ctx, sc, addThen(postgres, key, func(ctx context.Context, q sqldb.Querier) error {
		if err := pg.Restart(); err != nil {
			return fmt.Errorf("restart: %w", err)
		}
		return nextStatement(ctx, q)
	}), 10*time.Second)
	t.Logf("%s: Do returned after %v (restart included): %v", driver, o.took, o.err)
	require.NotContains(t, fmt.Sprint(o.err), "restart:")
	var n int
	require.Eventually(t, func() bool {
		return direct.Get(&n, `SELECT n FROM `+Table+` WHERE id = $1`, key) == nil
	}, 5*time.Second, 10*time.Millisecond)
	switch {
	case o.err == nil:
		require.Equal(t, 1, n)
	case s.Transactional:
		require.Zero(t, n, "the transaction the restart cut short was rolled back")
	}
	requireFreeWithin(t, sc, s.Lease+time.Second)
	// The pool works again.
	_, err := takeOver(t, sc, 5*time.Second)
	require.NoError(t, err)
}

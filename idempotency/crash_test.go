package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/faultproxy"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// The child's orders, in its environment.
const (
	crashPoint  = "CONTEND_IDEM_CRASH_POINT"
	crashDriver = "CONTEND_IDEM_CRASH_DRIVER"
	crashURL    = "CONTEND_IDEM_CRASH_URL"
)

// childLease is the lease of the external call the child makes.
const childLease = 3 * time.Second

// TestCrashChild is the process TestCrashPoints kills: it calls the store
// on key "crash" and, at the point it was told, says so and waits to be
// killed with SIGKILL. Run by itself, without orders, it does nothing.
func TestCrashChild(t *testing.T) {
	point := os.Getenv(crashPoint)
	if point == "" {
		return
	}
	e := reopen(t, os.Getenv(crashDriver), os.Getenv(crashURL))
	at := func(p string) {
		if p == point {
			fmt.Printf("AT %s\n", p)
			time.Sleep(time.Minute)
		}
	}
	s := e.store(t, idempotency.Config{Lease: childLease, Observer: contend.ObserverFunc(func(_ context.Context, ev contend.Event) {
		switch ev.Kind {
		case contend.EventObtained:
			at("before-fn") // the key's record is inserted, fn not yet run
		case contend.EventReleased:
			at("after-commit") // committed, Do has not returned
		}
	})})
	ctx := t.Context()
	fn := func(ctx context.Context) ([]byte, error) {
		a, err := e.writeEffect(ctx, "crash", "fp")
		at("inside-fn")
		return a, err
	}
	switch point {
	case "external-inside-fn":
		_, _, err := s.DoExternal(ctx, "crash", "fp", func(_ context.Context, fence int64) ([]byte, error) {
			fmt.Printf("FENCE %d\n", fence)
			at(point) // the external call was made; its answer not recorded
			return nil, nil
		})
		require.NoError(t, err)
	case "after-fn-before-commit":
		// Do in a transaction of the child's: Do has written the record,
		// the owner has not committed.
		tx, err := e.own.BeginTxx(ctx, nil)
		require.NoError(t, err)
		_, _, err = s.Do(contend.WithQuerier(ctx, tx), "crash", "fp", fn)
		require.NoError(t, err)
		at(point)
		require.NoError(t, tx.Commit())
	default:
		_, _, err := s.Do(ctx, "crash", "fp", fn)
		require.NoError(t, err)
	}
	t.Fatalf("the child reached the end: no crash point %q", point)
}

// A process killed with SIGKILL at each point of a call; then a retry: the
// effect happened exactly once, and the retry's answer is the effect's.
func TestCrashPoints(t *testing.T) {
	if os.Getenv(crashPoint) != "" {
		return // a child runs TestCrashChild only; never spawn from one
	}
	points := map[string]bool{ // → the retry replays
		"before-fn":              false,
		"inside-fn":              false,
		"after-fn-before-commit": false,
		"after-commit":           true,
	}
	for _, driver := range []string{"postgres", "pgx", testserver.MariaDBDriver} {
		for point, replays := range points {
			t.Run(driver+"/"+point, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, driver)
				c := harness.StartChild(t, "TestCrashChild", crashPoint+"="+point, crashDriver+"="+driver, crashURL+"="+e.url)
				c.Next(t, "AT "+point, 60*time.Second)
				require.NoError(t, c.Cmd.Process.Kill())
				_ = c.Cmd.Wait()

				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				s := e.store(t, idempotency.Config{})
				answer, replayed, err := s.Do(ctx, "crash", "fp", e.effect("crash", "fp"))
				require.NoError(t, err)
				require.Equal(t, replays, replayed)
				require.Equal(t, 1, e.effects(t, "crash"), "exactly one effect")
				require.NoError(t, check(ctx, e, "crash", "fp", answer, nil))
			})
		}
	}
}

// An external call killed after its external effect: the key stays taken
// until the lease ends (NoWait says in flight); then a retry takes it with
// a larger fence and runs fn again, as the docs say it may.
func TestCrashExternal(t *testing.T) {
	if os.Getenv(crashPoint) != "" {
		return
	}
	for _, driver := range []string{"pgx", testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, driver)
			c := harness.StartChild(t, "TestCrashChild", crashPoint+"=external-inside-fn", crashDriver+"="+driver, crashURL+"="+e.url)
			stale, err := strconv.ParseInt(strings.TrimSpace(c.Next(t, "FENCE ", 60*time.Second)), 10, 64)
			require.NoError(t, err)
			c.Next(t, "AT ", 10*time.Second)
			killed := time.Now()
			require.NoError(t, c.Cmd.Process.Kill())
			_ = c.Cmd.Wait()

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, _, err = e.store(t, idempotency.Config{NoWait: true}).DoExternal(ctx, "crash", "fp", func(context.Context, int64) ([]byte, error) {
				return nil, errors.New("ran under a live lease")
			})
			require.ErrorIs(t, err, idempotency.ErrInFlight)
			var fence int64
			_, replayed, err := e.store(t, idempotency.Config{}).DoExternal(ctx, "crash", "fp", func(_ context.Context, f int64) ([]byte, error) {
				fence = f
				return []byte("again"), nil
			})
			require.NoError(t, err)
			require.False(t, replayed)
			require.Greater(t, fence, stale)
			t.Logf("%s: the retry ran %v after the kill (lease %v), fence %d after %d", driver, time.Since(killed).Round(time.Millisecond), childLease, fence, stale)
		})
	}
}

// The COMMIT's reply is lost: the call cannot tell whether it committed,
// and says so within FinishTimeout; the retry finds out: it replays the
// committed answer, and the effect happened once.
func TestCommitReplyDropped(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, driver)
			u, err := neturl.Parse(e.url)
			require.NoError(t, err)
			proxy := faultproxy.Start(t, u.Host)
			u.Host = proxy.Addr()
			proxied := testserver.Handle(t, driver, u.String())
			const finish = time.Second
			// Armed once the key is taken: MySQL's BEGIN says READ
			// COMMITTED, whose reply must not be the one dropped.
			arm := contend.ObserverFunc(func(_ context.Context, ev contend.Event) {
				if ev.Kind == contend.EventObtained {
					proxy.DropReplyTo("COMMIT")
				}
			})
			s, err := idempotency.New(proxied, idempotency.Config{Table: "idem", FinishTimeout: finish, Observer: arm})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()

			var ran []byte
			began := time.Now()
			_, _, err = s.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
				a, err := e.writeEffect(ctx, "k", "fp")
				ran = a
				return a, err
			})
			took := time.Since(began)
			require.Error(t, err, "the commit's reply never came")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, took, finish+3*time.Second)
			t.Logf("%s: the call returned after %v: %v", driver, took.Round(time.Millisecond), err)
			proxy.Heal()

			again, replayed, err := e.store(t, idempotency.Config{}).Do(ctx, "k", "fp", e.effect("k", "fp"))
			require.NoError(t, err)
			require.True(t, replayed, "the COMMIT was applied: the retry replays")
			require.Equal(t, ran, again)
			require.Equal(t, 1, e.effects(t, "k"))
		})
	}
}

package adaptive_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/adaptive"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// The tests of this file run on MariaDB, through go-sql-driver/mysql.

// The whole Guard contract on MariaDB, as the guard adapts (the suite's
// contention runs turn their keys hot, so both modes run) and with every
// call locked, exclusion included.
func TestGuardIsAGuardOnMariaDB(t *testing.T) {
	t.Run("adapting", func(t *testing.T) {
		s := guardSuite(testserver.MariaDBDriver, nil)
		s.Ops = 4
		guardtest.Run(t, s)
	})
	t.Run("locked", func(t *testing.T) {
		m := adaptive.Pessimistic
		s := guardSuite(testserver.MariaDBDriver, &m)
		s.Ops = 4
		guardtest.Run(t, s)
	})
}

// Both modes in MySQL's words: each moves the version once per commit (the
// lock, an UPDATE without RETURNING, counts its row), fn's error rolls back,
// a missing row is ErrNotFound.
func TestDoInEachModeOnMariaDB(t *testing.T) {
	for _, m := range []adaptive.Mode{adaptive.Optimistic, adaptive.Pessimistic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			h := testserver.Handle(t, testserver.MariaDBDriver, testserver.MariaDB(t)).(testserver.MariaDBHandle)
			_, err := h.DB.Exec("CREATE TABLE counters (id varchar(64) PRIMARY KEY, n bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0)")
			require.NoError(t, err)
			_, err = h.DB.Exec("INSERT INTO counters (id) VALUES ('a')")
			require.NoError(t, err)
			g := newGuard(t, h, adaptive.Config{})
			g.Pin(m)
			ctx := t.Context()
			add := func(ctx context.Context) error {
				_, err := contend.Querier(ctx, h.DB).ExecContext(ctx, "UPDATE counters SET n = n + 1 WHERE id = 'a'")
				return err
			}
			row := func() counter {
				var c counter
				require.NoError(t, h.DB.Get(&c, "SELECT * FROM counters WHERE id = 'a'"))
				return c
			}

			require.NoError(t, g.Do(ctx, "a", add))
			require.Equal(t, counter{ID: "a", N: 1, Version: 1}, row())
			sentinel := errors.New("fn failed")
			err = g.Do(ctx, "a", func(ctx context.Context) error {
				require.NoError(t, add(ctx))
				return sentinel
			})
			require.Equal(t, sentinel, err)
			require.Equal(t, counter{ID: "a", N: 1, Version: 1}, row(), "fn's writes and the bump roll back")
			err = g.Do(ctx, "ghost", func(context.Context) error { t.Error("fn ran for a missing row"); return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
		})
	}
}

// alternating sends every other call to opt and the others to pess.
type alternating struct {
	opt, pess contend.Guard
	calls     *atomic.Int64
}

func (g alternating) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if g.calls.Add(1)%2 == 0 {
		return g.pess.Do(ctx, key, fn)
	}
	return g.opt.Do(ctx, key, fn)
}

// Optimistic and locked calls race on one key from 3 processes, through the
// suite's read-pause-write: no update is lost, because the locked path's
// bump is what an optimistic check sees. When the locked path locks the
// row without moving the version (the negative control), updates are lost.
func TestMixedModesOnMariaDB(t *testing.T) {
	for _, skipBump := range []bool{false, true} {
		name := "bump"
		if skipBump {
			name = "skip_bump_control"
		}
		t.Run(name, func(t *testing.T) {
			base := guardSuite(testserver.MariaDBDriver, nil)
			s := guardtest.Suite{Driver: base.Driver, Setup: base.Setup,
				New: func(t testing.TB, env guardtest.Env) contend.Guard {
					opt := newGuard(t, env.Handle, adaptive.Config{Table: "guardtest_counters", KeyColumn: "key", Retry: bigBudget})
					opt.Pin(adaptive.Optimistic)
					pess := newGuard(t, env.Handle, adaptive.Config{Table: "guardtest_counters", KeyColumn: "key", Retry: bigBudget})
					pess.Pin(adaptive.Pessimistic)
					if skipBump {
						pess.SkipBump()
					}
					return alternating{opt, pess, new(atomic.Int64)}
				},
			}
			rep := guardtest.Contend(t, s, harness.Config{Processes: 3, Goroutines: 8, Ops: 6, Keys: []string{"hot"}})
			if !skipBump {
				rep.RequireHeld(t, s)
				return
			}
			rep.RequireLost(t)
		})
	}
}

// A row lock taken in the locked path's fn joins its transaction. Under
// REPEATABLE READ a read in fn before that lock fixes the snapshot, and the
// lock's fn reads its row as it was then: the read-pause-write of a counter
// under the lock, from 3 processes, loses updates (the negative control).
// At the locked path's default on MariaDB, READ COMMITTED, it loses none.
func TestLockInsideTheLockedPathReadsTheLatestCommitOnMariaDB(t *testing.T) {
	guardtest.NestedLosesNoUpdate(t, testserver.MariaDBDriver,
		func(t testing.TB, env guardtest.Env, isolation sql.IsolationLevel) contend.Guard {
			g := newGuard(t, env.Handle, adaptive.Config{Table: guardtest.OuterTable, Retry: bigBudget})
			g.Pin(adaptive.Pessimistic)
			if isolation != sql.LevelDefault {
				g.Isolation(isolation)
			}
			return g
		},
		func(t testing.TB, env guardtest.Env) contend.Guard {
			l, err := pessimistic.NewLocker(env.Handle, pessimistic.LockerConfig{Table: "guardtest_counters", KeyColumn: "key"})
			require.NoError(t, err)
			return l
		})
}

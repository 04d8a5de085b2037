package guardtest

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// OuterTable holds the rows of the outer guard of [Nested]: keys "o0",
// "o1", ..., and a version column.
const OuterTable = "guardtest_outers"

// Outers creates [OuterTable] with n rows, for a Suite's Setup.
func Outers(t testing.TB, env Env, n int) {
	t.Helper()
	_, err := env.DB.Exec(`CREATE TABLE ` + OuterTable + ` (id varchar(64) PRIMARY KEY, version bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	for i := range n {
		_, err := env.DB.Exec(`INSERT INTO `+OuterTable+` (id) VALUES (`+env.Dialect.Param(1)+`)`, "o"+strconv.Itoa(i))
		require.NoError(t, err)
	}
}

// Nested returns a guard that nests inner in outer, as an application
// nests guards: Do runs outer for one of the n keys of [Outers], picked at
// random so that outer calls rarely race each other, and outer's fn reads
// the outer table, pauses so that other calls commit meanwhile, then runs
// inner for the key, which does the work. The read is a plain one: under
// REPEATABLE READ it fixes the transaction's snapshot before inner's lock
// is had.
func Nested(env Env, outer, inner contend.Guard, n int) contend.Guard {
	return nested{env, outer, inner, n}
}

type nested struct {
	env          Env
	outer, inner contend.Guard
	n            int
}

func (g nested) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	return g.outer.Do(ctx, "o"+strconv.Itoa(rand.IntN(g.n)), func(ctx context.Context) error {
		var rows int64
		if err := testserver.Querier(ctx, g.env.Handle).QueryRow(ctx, `SELECT count(*) FROM `+OuterTable).Scan(&rows); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
		return g.inner.Do(ctx, key, fn)
	})
}

// NestedLosesNoUpdate runs the read-pause-write of a counter from 3
// processes under inner, nested in outer by [Nested] on driver's server,
// twice: with outer built at sql.LevelDefault, where no update may be lost,
// and, as the negative control, at REPEATABLE READ, where inner's fn reads
// the snapshot its read fixed and loses updates (on MySQL and MariaDB). An
// outer guard that must hold there runs its own transactions at READ
// COMMITTED.
func NestedLosesNoUpdate(t *testing.T, driver string,
	outer func(t testing.TB, env Env, isolation sql.IsolationLevel) contend.Guard,
	inner func(t testing.TB, env Env) contend.Guard) {
	const outers = 200
	for _, c := range []struct {
		name      string
		isolation sql.IsolationLevel
	}{{"default", sql.LevelDefault}, {"repeatable_read_control", sql.LevelRepeatableRead}} {
		t.Run(c.name, func(t *testing.T) {
			s := Suite{
				Driver: driver,
				Setup:  func(t testing.TB, env Env, _ []string) { Outers(t, env, outers) },
				New: func(t testing.TB, env Env) contend.Guard {
					return Nested(env, outer(t, env, c.isolation), inner(t, env), outers)
				},
				Exclusive: true, // inner locks
			}
			rep := Contend(t, s, harness.Config{Processes: 3, Goroutines: 8, Ops: 4, Keys: []string{"hot"}})
			if c.isolation == sql.LevelDefault {
				rep.RequireHeld(t, s)
				return
			}
			rep.RequireLost(t)
		})
	}
}

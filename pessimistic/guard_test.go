package pessimistic_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// lockRows makes the rows the row guard locks, one per key.
func lockRows(t testing.TB, env guardtest.Env, keys []string) {
	t.Helper()
	_, err := env.DB.Exec(`CREATE TABLE locks (id text PRIMARY KEY)`)
	require.NoError(t, err)
	for _, k := range keys {
		_, err = env.DB.Exec(`INSERT INTO locks (id) VALUES ($1)`, k)
		require.NoError(t, err)
	}
	require.NoError(t, err)
}

// The whole Guard contract, per mode: waiting guards must never give up,
// NOWAIT ones must answer a held key with ErrConflict at once, and both must
// keep fns for one key from overlapping across processes. Drivers alternate
// to keep the run short (a suite runs three processes for seconds); SKIP
// LOCKED answers a held key as NOWAIT does, which TestSkipLocked checks.
func TestLockerIsAGuard(t *testing.T) {
	for _, c := range []struct {
		name, driver string
		mode         pessimistic.OnHeld
	}{
		{"wait/pgx", "pgx", pessimistic.Wait},
		{"nowait/postgres", "postgres", pessimistic.NoWait},
		{"wait/pgx-native", testserver.PgxNative, pessimistic.Wait},
	} {
		t.Run(c.name, func(t *testing.T) {
			guardtest.Run(t, guardtest.Suite{
				Driver: c.driver,
				Setup:  lockRows,
				NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
					return pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "locks", OnHeld: c.mode})
				},
				FailFast:  c.mode != pessimistic.Wait,
				Exclusive: true,
			})
		})
	}
}

func TestAdvisoryIsAGuard(t *testing.T) {
	for _, c := range []struct {
		name, driver string
		mode         pessimistic.OnHeld
	}{
		{"wait/postgres", "postgres", pessimistic.Wait},
		{"try/pgx", "pgx", pessimistic.NoWait},
		{"try/pgx-native", testserver.PgxNative, pessimistic.NoWait},
	} {
		t.Run(c.name, func(t *testing.T) {
			guardtest.Run(t, guardtest.Suite{
				Driver: c.driver,
				NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
					return pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{OnHeld: c.mode})
				},
				FailFast:  c.mode == pessimistic.NoWait,
				Exclusive: true,
			})
		})
	}
}

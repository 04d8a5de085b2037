package adaptive_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// The adaptive guard's fn locks its own row and, inside, takes a Locker
// lock on the other call's row: the server breaks the deadlock by rolling
// one transaction back (InnoDB: the whole of it). The caller ignores the
// nested ErrConflict and goes on writing; the guard must still answer nil
// only when all of fn's writes are committed, and commit none otherwise.
func TestCarelessNestedLockTellsTheTruth(t *testing.T) {
	nest := func(t testing.TB, env guardtest.Env) contend.Guard {
		l, err := pessimistic.NewLocker(env.Handle, pessimistic.LockerConfig{Table: "guardtest_counters", KeyColumn: "key"})
		require.NoError(t, err)
		return l
	}
	for _, driver := range []string{testserver.MariaDBDriver, "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			nested, _ := guardtest.CarelessNesting(t, guardSuite(driver, nil), 20, nest)
			require.Positive(t, nested, "no nested lock failed: the calls never crossed")
		})
	}
}

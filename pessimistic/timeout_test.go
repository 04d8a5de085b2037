package pessimistic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/pessimistic"
)

// In a caller's transaction a lock that answers "no" without aborting the
// transaction (a row held under SKIP LOCKED, a missing row, an advisory key
// held under NOWAIT) still puts the caller's lock_timeout back: the caller's
// later statements must not run under the locker's setting.
func TestLockTimeoutIsRestoredWhenTheLockFails(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 1, "held", "free")
	hold(t, db, "held")
	other, err := db.Beginx()
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Rollback() })
	_, err = other.Exec(`SELECT pg_advisory_xact_lock(hashtextextended('adv', 0))`)
	require.NoError(t, err)
	ctx := t.Context()

	for name, c := range map[string]struct {
		lock func(tx contend.DBTX) error
		want error
	}{
		"skip locked, held": {func(tx contend.DBTX) error {
			l := newLocker(t, tx, pessimistic.LockerConfig{OnHeld: pessimistic.SkipLocked, LockTimeout: 50 * time.Millisecond})
			return l.Do(ctx, "held", func(context.Context) error { return nil })
		}, contend.ErrConflict},
		"missing row": {func(tx contend.DBTX) error {
			l := newLocker(t, tx, pessimistic.LockerConfig{LockTimeout: 50 * time.Millisecond})
			return l.Do(ctx, "nosuchrow", func(context.Context) error { return nil })
		}, contend.ErrNotFound},
		"advisory nowait, held": {func(tx contend.DBTX) error {
			a := advisory(t, tx, pessimistic.AdvisoryConfig{OnHeld: pessimistic.NoWait, LockTimeout: 50 * time.Millisecond})
			return a.Do(ctx, "adv", func(context.Context) error { return nil })
		}, contend.ErrConflict},
		"success": {func(tx contend.DBTX) error {
			l := newLocker(t, tx, pessimistic.LockerConfig{LockTimeout: 50 * time.Millisecond})
			return l.Do(ctx, "free", func(context.Context) error { return nil })
		}, nil},
	} {
		tx, err := db.Beginx()
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		_, err = tx.Exec(`SET LOCAL lock_timeout = '7s'`)
		require.NoError(t, err)
		err = c.lock(tx)
		if c.want == nil {
			require.NoError(t, err, name)
		} else {
			require.ErrorIs(t, err, c.want, name)
		}
		var setting string
		require.NoError(t, tx.Get(&setting, `SHOW lock_timeout`), name)
		require.Equal(t, "7s", setting, "%s: the caller's lock_timeout was not put back", name)
		require.NoError(t, tx.Rollback())
	}
}

package pessimistic_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/txn/txntest"
	"github.com/contend/contend/pessimistic"
)

// A handle the locker cannot tell for a pool or a transaction (a logging
// wrapper with only DBTX's methods) is refused. Taken for a caller's
// transaction, its statements would run in autocommit: the lock would end
// with its own statement, and two fns for one key would overlap.
func TestWrappedHandleIsRefused(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	products(t, db, 5, "p")
	w := txntest.Wrapped{DBTX: db}
	for name, newGuard := range map[string]func() (contend.Guard, error){
		"row": func() (contend.Guard, error) {
			return pessimistic.NewLocker(w, pessimistic.LockerConfig{Table: "products"})
		},
		"advisory": func() (contend.Guard, error) { return pessimistic.NewAdvisory(w, pessimistic.AdvisoryConfig{}) },
	} {
		g, err := newGuard()
		if err == nil {
			requireExclusive(t, g, "p", name)
		}
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
}

// requireExclusive fails t when a second fn for key gets in while a first
// one is inside.
func requireExclusive(t *testing.T, g contend.Guard, key, name string) {
	t.Helper()
	ctx := t.Context()
	var inside atomic.Bool
	entered, secondRan := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- g.Do(ctx, key, func(context.Context) error {
			inside.Store(true)
			defer inside.Store(false)
			close(entered)
			// Unlocked, the second fn runs now; locked, it waits for this
			// transaction, which ends only after this wait.
			select {
			case <-secondRan:
			case <-time.After(300 * time.Millisecond):
			}
			return nil
		})
	}()
	<-entered
	overlapped := false
	err := g.Do(ctx, key, func(context.Context) error {
		overlapped = inside.Load()
		close(secondRan)
		return nil
	})
	require.NoError(t, err, name)
	require.NoError(t, <-first, name)
	require.False(t, overlapped, "%s: two fns for %q ran at once: the guard ran them unlocked", name, key)
}

// A typed nil pool is refused at construction, not a panic at the first call.
func TestTypedNilDBIsRefused(t *testing.T) {
	t.Parallel()
	var db *sql.DB
	_, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "products"})
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = pessimistic.NewAdvisory(db, pessimistic.AdvisoryConfig{})
	require.ErrorIs(t, err, contend.ErrInvalid)
}

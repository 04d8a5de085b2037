package txn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// lateRows is a driver's answer that comes after the caller gave up: Next
// returns once arrive is closed, with one row. It stands for the library's
// side of a read, not for a server: whether a late row is scanned into the
// caller's variables is WatchScan's decision alone, which real drivers
// rarely let a test reach (lib/pq and database/sql refuse most rows read
// after ctx ended).
type lateRows struct {
	arrive <-chan struct{}
	closed chan struct{}
	next   bool
}

func (r *lateRows) Next() bool {
	<-r.arrive
	r.next = !r.next
	return r.next
}

func (r *lateRows) Scan(dest ...any) error {
	*dest[0].(*int) = 42
	return nil
}

func (r *lateRows) Err() error { return nil }

func (r *lateRows) Close() error {
	select {
	case <-r.closed:
	default:
		close(r.closed)
	}
	return nil
}

type lateQuerier struct{ rows *lateRows }

func (q lateQuerier) Exec(context.Context, string, ...any) (int64, error) {
	return 0, errors.New("not a statement")
}

func (q lateQuerier) QueryRow(context.Context, string, ...any) sqldb.Row { return nil }

func (q lateQuerier) Query(context.Context, string, ...any) (sqldb.Rows, error) { return q.rows, nil }

// A read given up on never writes into the caller's variables once
// WatchScan has returned, even when its row arrives afterwards; one that
// answers in time is scanned.
func TestWatchScanWritesNothingAfterItReturned(t *testing.T) {
	t.Parallel()
	arrive := make(chan struct{})
	rows := &lateRows{arrive: arrive, closed: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	v := -1
	err := txn.WatchScan(ctx, lateQuerier{rows}, "SELECT", nil, []any{&v})
	require.ErrorIs(t, err, txn.ErrNoAnswer)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(arrive) // the row comes now
	<-rows.closed // the read is over
	require.Equal(t, -1, v, "the row was scanned into the caller's variable after WatchScan returned")

	inTime := &lateRows{arrive: arrive, closed: make(chan struct{})}
	ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, txn.WatchScan(ctx, lateQuerier{inTime}, "SELECT", nil, []any{&v}))
	require.Equal(t, 42, v)
}

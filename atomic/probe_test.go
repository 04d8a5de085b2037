package atomic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
)

// A claim that waits for the row lock of a transaction that deletes the
// row answers ErrNotFound once that transaction commits: the row is gone,
// not held. Its statement began while the row was there, so what it read
// at its start cannot say so.
func TestClaimOfARowDeletedWhileItWaitedIsNotFound(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		for name, cfg := range map[string]atomic.ClaimerConfig{"plain": plain, "leased": leased} {
			t.Run(driver+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testserver.DB(t, driver)
				bots(t, db, "bot")
				c := claimer(t, db, cfg)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()

				del, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer del.Rollback()
				var pid int
				require.NoError(t, del.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
				_, err = del.ExecContext(ctx, "DELETE FROM bots WHERE id = 'bot'")
				require.NoError(t, err)

				claimed := make(chan error, 1)
				go func() {
					_, err := c.Claim(ctx, "bot")
					claimed <- err
				}()
				// The claim waits for the deleter's row lock.
				require.Eventually(t, func() bool {
					var waiting bool
					err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))", pid).Scan(&waiting)
					return err == nil && waiting
				}, 5*time.Second, 10*time.Millisecond)
				require.NoError(t, del.Commit())

				err = <-claimed
				require.ErrorIs(t, err, contend.ErrNotFound)
				require.NotErrorIs(t, err, contend.ErrConflict)
			})
		}
	}
}

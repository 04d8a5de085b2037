package atomic_test

import (
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/mysqldb"
)

// A claim made inside a caller's transaction that began longer than a lease
// ago: its lease runs a full lease from the claim's statement, not from the
// transaction's start, or it would commit a claim already expired that
// another instance may take at once. An extension in that transaction
// pushes the lease from its own statement too; and a lease that passed
// after the transaction began counts as passed.
func TestLeaseRunsFromTheStatementInAnOldTransaction(t *testing.T) {
	t.Parallel()
	type server struct {
		driver, sleep, now string
		bots               func(testing.TB, *sqlx.DB, ...string)
	}
	pg := server{sleep: "SELECT pg_sleep(0.6)", now: "SELECT clock_timestamp()", bots: bots}
	maria := server{driver: testserver.MariaDBDriver, sleep: "SELECT SLEEP(0.6)", now: "SELECT UTC_TIMESTAMP(6)", bots: mariaBots}
	servers := map[string]server{}
	for _, d := range testserver.Drivers {
		pg.driver = d
		servers[d] = pg
	}
	servers["mariadb"] = maria
	for name, s := range servers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, s.driver)
			s.bots(t, db, "bot", "taken")
			var h contend.DB = db
			if s.driver == testserver.MariaDBDriver {
				h = mysqldb.Wrap(db)
			}
			c := claimer(t, h, leased)
			ctx := t.Context()

			// Another instance claims "taken" after the transaction began;
			// its lease passes while the transaction sleeps.
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()
			var begun time.Time
			require.NoError(t, tx.QueryRowContext(ctx, s.now).Scan(&begun))
			_, err = c.Claim(ctx, "taken")
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, s.sleep) // longer than the lease
			require.NoError(t, err)

			inTx := contend.WithQuerier(ctx, tx)
			leaseOf := func(id string) (until, now time.Time) {
				t.Helper()
				require.NoError(t, tx.QueryRowContext(ctx, "SELECT lease_until FROM bots WHERE id = "+param(s.driver), id).Scan(&until))
				require.NoError(t, tx.QueryRowContext(ctx, s.now).Scan(&now))
				return until, now
			}
			var before time.Time
			require.NoError(t, tx.QueryRowContext(ctx, s.now).Scan(&before))
			require.Greater(t, before.Sub(begun), leased.Lease, "the transaction is older than a lease")
			tok, err := c.Claim(inTx, "bot")
			require.NoError(t, err)
			until, _ := leaseOf("bot")
			require.GreaterOrEqual(t, until.Sub(before), leased.Lease, "the lease ends a full lease after the claim")

			require.NoError(t, tx.QueryRowContext(ctx, s.now).Scan(&before))
			extended, err := c.Extend(inTx, "bot", tok)
			require.NoError(t, err)
			require.True(t, extended)
			until, _ = leaseOf("bot")
			require.GreaterOrEqual(t, until.Sub(before), leased.Lease, "the extension runs a full lease from itself")

			_, err = c.Claim(inTx, "taken")
			require.NoError(t, err, "a lease that passed during the transaction has passed")
		})
	}
}

// param is the first placeholder of driver's server.
func param(driver string) string {
	if driver == testserver.MariaDBDriver {
		return "?"
	}
	return "$1"
}

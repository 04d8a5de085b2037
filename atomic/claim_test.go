package atomic_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/guardtest"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// bots is the bot table of the "start bot" story: a bot may run one engine at a time.
func bots(t testing.TB, db *sqlx.DB, ids ...string) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE bots (id text PRIMARY KEY, engine_id text, lease_until timestamptz)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO bots (id) SELECT unnest($1::text[])`, pq.Array(ids))
	require.NoError(t, err)
}

var (
	plain  = atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id"}
	leased = atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: 300 * time.Millisecond}
)

func claimer(t testing.TB, db contend.DB, cfg atomic.ClaimerConfig) *atomic.Claimer {
	t.Helper()
	c, err := atomic.NewClaimer(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

func ownerOf(t testing.TB, db *sqlx.DB, id string) *string {
	t.Helper()
	var owner *string
	require.NoError(t, db.Get(&owner, `SELECT engine_id FROM bots WHERE id = $1`, id))
	return owner
}

// longLeased is the leased configuration of the conformance suites: its lease
// is long enough that a loaded machine's slow extension does not count as a
// lost claim. TestDoExtendsTheLease covers short ones.
var longLeased = atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: 3 * time.Second}

// claimerSuite runs the Guard contract against a claimer of cfg on driver's
// server, on a bots table that makeBots creates with a row per key.
func claimerSuite(t *testing.T, driver string, makeBots func(testing.TB, *sqlx.DB, ...string), cfg atomic.ClaimerConfig) {
	guardtest.Run(t, guardtest.Suite{
		Driver: driver,
		Setup:  func(t testing.TB, env guardtest.Env, keys []string) { makeBots(t, env.DB, keys...) },
		NewOn: func(_ guardtest.Env, db contend.DB) (contend.Guard, error) {
			return atomic.NewClaimer(db, cfg)
		},
		FailFast:  true,
		Exclusive: true,
	})
}

func TestClaimerIsAGuard(t *testing.T) {
	configs := map[string]atomic.ClaimerConfig{"plain": plain, "leased": longLeased}
	// Each driver once, each configuration on both code paths: database/sql
	// (lib/pq plain, pgx's stdlib leased) and pgx native (leased, the
	// configuration with the most statements; TestClaimUnderContention runs
	// it plain). The suite is a few seconds a run.
	for _, run := range []struct{ driver, config string }{
		{"postgres", "plain"}, {"pgx", "leased"}, {testserver.PgxNative, "leased"},
	} {
		t.Run(run.driver+"/"+run.config, func(t *testing.T) { claimerSuite(t, run.driver, bots, configs[run.config]) })
	}
}

func TestClaimRelease(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			bots(t, db, "bot-1")
			c := claimer(t, db, plain)
			ctx := t.Context()

			token, err := c.Claim(ctx, "bot-1")
			require.NoError(t, err)
			require.Len(t, token, 32)
			require.Equal(t, token, *ownerOf(t, db, "bot-1"))

			_, err = c.Claim(ctx, "bot-1")
			require.ErrorIs(t, err, contend.ErrConflict)
			require.NotErrorIs(t, err, contend.ErrNotFound)

			released, err := c.Release(ctx, "bot-1", "not-the-token")
			require.NoError(t, err)
			require.False(t, released)
			require.Equal(t, token, *ownerOf(t, db, "bot-1"), "a wrong token must not clear the claim")

			released, err = c.Release(ctx, "bot-1", token)
			require.NoError(t, err)
			require.True(t, released)
			require.Nil(t, ownerOf(t, db, "bot-1"))

			released, err = c.Release(ctx, "bot-1", token)
			require.NoError(t, err)
			require.False(t, released, "a second release reports false")

			require.NoError(t, c.ClaimAs(ctx, "bot-1", "engine-42"))
			require.Equal(t, "engine-42", *ownerOf(t, db, "bot-1"))
		})
	}
}

// The rule: a late release must not clear a newer claim.
func TestStaleReleaseKeepsNewerClaim(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	bots(t, db, "bot")
	c := claimer(t, db, plain)
	ctx := t.Context()
	old, err := c.Claim(ctx, "bot")
	require.NoError(t, err)
	released, err := c.Release(ctx, "bot", old)
	require.NoError(t, err)
	require.True(t, released)
	newer, err := c.Claim(ctx, "bot")
	require.NoError(t, err)

	released, err = c.Release(ctx, "bot", old) // the first holder's retry, arriving late
	require.NoError(t, err)
	require.False(t, released)
	require.Equal(t, newer, *ownerOf(t, db, "bot"))
}

func TestMissingRowIsNotAConflict(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	bots(t, db)
	c := claimer(t, db, plain)
	_, err := c.Claim(t.Context(), "ghost")
	require.ErrorIs(t, err, contend.ErrNotFound)
	require.NotErrorIs(t, err, contend.ErrConflict)
	err = c.Do(t.Context(), "ghost", func(context.Context) error { t.Error("fn ran for a missing row"); return nil })
	require.ErrorIs(t, err, contend.ErrNotFound)
}

// A claim whose lease has passed can be taken over, and the old holder's
// release then fails.
func TestExpiredLeaseCanBeTakenOver(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			bots(t, db, "bot")
			c := claimer(t, db, atomic.ClaimerConfig{Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: time.Hour})
			ctx := t.Context()

			old, err := c.Claim(ctx, "bot")
			require.NoError(t, err)
			_, err = c.Claim(ctx, "bot")
			require.ErrorIs(t, err, contend.ErrConflict, "an unexpired lease holds")

			// The holder crashed an hour ago: move its deadline into the past
			// rather than wait.
			_, err = db.Exec(`UPDATE bots SET lease_until = now() - interval '1 second' WHERE id = 'bot'`)
			require.NoError(t, err)
			extended, err := c.Extend(ctx, "bot", old)
			require.NoError(t, err)
			require.False(t, extended, "an expired claim is not revived")

			newer, err := c.Claim(ctx, "bot")
			require.NoError(t, err)
			released, err := c.Release(ctx, "bot", old)
			require.NoError(t, err)
			require.False(t, released, "the old holder's release must fail")
			require.Equal(t, newer, *ownerOf(t, db, "bot"))

			var until time.Time
			require.NoError(t, db.Get(&until, `SELECT lease_until FROM bots WHERE id = 'bot'`))
			require.WithinDuration(t, time.Now().Add(time.Hour), until, time.Minute)
		})
	}
}

// Do keeps extending the lease while fn runs longer than the lease, so nobody
// can take the claim over meanwhile.
func TestDoExtendsTheLease(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	bots(t, db, "bot")
	// A lease of 1s, extended every 333ms: a loaded machine (CI beside
	// other runs, load 14) has taken over 200ms for one extension, which
	// lost a 300ms lease, as it must.
	cfg := leased
	cfg.Lease = time.Second
	c := claimer(t, db, cfg)
	other := claimer(t, db, cfg)
	err := c.Do(t.Context(), "bot", func(ctx context.Context) error {
		deadline := time.Now().Add(3 * cfg.Lease)
		for time.Now().Before(deadline) {
			if _, err := other.Claim(ctx, "bot"); !errors.Is(err, contend.ErrConflict) {
				return errors.New("the claim could be taken while its holder was working")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return ctx.Err()
	})
	require.NoError(t, err)
	require.Nil(t, ownerOf(t, db, "bot"))
}

// When the claim is taken away while fn runs, fn's ctx is cancelled with
// ErrLockLost and Do reports it.
func TestDoReportsALostClaim(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	bots(t, db, "bot")
	c := claimer(t, db, leased)
	var cause error
	err := c.Do(t.Context(), "bot", func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, `UPDATE bots SET engine_id = 'intruder' WHERE id = 'bot'`)
		require.NoError(t, err)
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("fn's ctx was not cancelled")
		}
	})
	require.ErrorIs(t, cause, contend.ErrLockLost)
	require.ErrorIs(t, err, contend.ErrLockLost)
	require.ErrorIs(t, err, context.Canceled, "fn's own error is kept")
	require.Equal(t, "intruder", *ownerOf(t, db, "bot"), "Do must not release someone else's claim")
}

// Without a lease, a claim cleared by someone else while fn ran is reported
// when Do releases.
func TestDoReportsAClaimGoneAtRelease(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	bots(t, db, "bot")
	c := claimer(t, db, plain)
	err := c.Do(t.Context(), "bot", func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, `UPDATE bots SET engine_id = NULL WHERE id = 'bot'`)
		return err
	})
	require.ErrorIs(t, err, contend.ErrLockLost)
}

// 64 goroutines in each of 3 processes claim the same key, round after round
// (one fresh key per round): exactly one claim wins each round.
func TestClaimUnderContention(t *testing.T) {
	for _, driver := range testserver.PathDrivers {
		t.Run(driver, func(t *testing.T) {
			const rounds = 10
			keys := make([]string, rounds)
			for i := range keys {
				keys[i] = "bot-" + strconv.Itoa(i)
			}
			var db *sqlx.DB
			cfg := harness.Config{Processes: 3, Goroutines: 64, Ops: rounds, Keys: keys}
			res := harness.Run(t, cfg,
				func() harness.Params {
					url := testserver.Postgres(t)
					db = testserver.Open(t, driver, url)
					bots(t, db, keys...)
					return harness.Params{"url": url}
				},
				func(t testing.TB, p harness.Params) harness.Op {
					c := claimer(t, testserver.Handle(t, driver, p["url"]), plain)
					return func(ctx context.Context, key string) error {
						_, err := c.Claim(ctx, key)
						return err
					}
				})
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			for _, k := range keys {
				require.Equal(t, 1, res.PerKey[k].Successes, "round %s", k)
				require.Equal(t, 3*64-1, res.PerKey[k].Conflicts, "round %s", k)
			}
			var claimed, distinct int
			require.NoError(t, db.QueryRow(`SELECT count(engine_id), count(DISTINCT engine_id) FROM bots`).Scan(&claimed, &distinct))
			require.Equal(t, rounds, claimed)
			require.Equal(t, rounds, distinct)
		})
	}
}

func TestNewClaimerRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	bots(t, db)
	ctx := t.Context()
	for name, cfg := range map[string]atomic.ClaimerConfig{
		"no table":          {},
		"injected table":    {Table: "bots; DROP TABLE x", OwnerColumn: "engine_id"},
		"quoted column":     {Table: "bots", OwnerColumn: `engine_id" = NULL --`},
		"bad key column":    {Table: "bots", KeyColumn: "id or 1=1", OwnerColumn: "engine_id"},
		"bad lease column":  {Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease until"},
		"negative lease":    {Table: "bots", OwnerColumn: "engine_id", LeaseColumn: "lease_until", Lease: -time.Second},
		"negative finish":   {Table: "bots", OwnerColumn: "engine_id", FinishTimeout: -time.Second},
		"three-part name":   {Table: "a.b.bots", OwnerColumn: "engine_id"},
		"leading digit":     {Table: "1bots", OwnerColumn: "engine_id"},
		"non-ascii":         {Table: "bötс", OwnerColumn: "engine_id"},
		"empty owner (dot)": {Table: "bots", OwnerColumn: "."},
	} {
		_, err := atomic.NewClaimer(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err := atomic.NewClaimer(nil, plain)
	require.ErrorIs(t, err, contend.ErrInvalid)

	// Well-formed names that do not exist: construction does no I/O, so
	// the first call says so, and so does every later one (a failed
	// preparation is not remembered).
	for _, cfg := range []atomic.ClaimerConfig{{Table: "nosuchtable"}, {Table: "bots", OwnerColumn: "nosuchcolumn"}} {
		c := claimer(t, db, cfg)
		for range 2 {
			_, err = c.Claim(ctx, "bot")
			require.Error(t, err)
			require.NotErrorIs(t, err, contend.ErrConflict)
			require.ErrorContains(t, err, "prepare claimer on "+cfg.Table)
		}
	}

	// The injection attempt reached nothing.
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM bots`))
}

func TestClaimRefusesBadKeys(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	bots(t, db, "bot")
	c := claimer(t, db, plain)
	ctx := t.Context()
	_, err := c.Claim(ctx, "")
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.ErrorIs(t, c.ClaimAs(ctx, "bot", ""), contend.ErrInvalid)
	_, err = c.Release(ctx, "", "t")
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = c.Extend(ctx, "bot", "t")
	require.ErrorIs(t, err, contend.ErrInvalid, "no lease column")
	require.Nil(t, ownerOf(t, db, "bot"), "refused input changed nothing")

	// Keys are values, never SQL.
	_, err = c.Claim(ctx, "bot' OR '1'='1")
	require.ErrorIs(t, err, contend.ErrNotFound)
	require.Nil(t, ownerOf(t, db, "bot"))
}

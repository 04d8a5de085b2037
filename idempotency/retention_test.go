package idempotency_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/testserver"
)

// A key whose retention ended runs fn again, and its record is taken over.
func TestExpiredKeyRunsAgain(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{Retention: 500 * time.Millisecond})
		first, _, err := s.Do(ctx, "k", "fp", e.effect("k", "fp"))
		require.NoError(t, err)
		again, replayed, err := s.Do(ctx, "k", "fp", e.effect("k", "fp"))
		require.NoError(t, err)
		require.True(t, replayed, "within the retention")
		require.Equal(t, first, again)

		time.Sleep(time.Second)
		third, replayed, err := s.Do(ctx, "k", "other", e.effect("k", "other"))
		require.NoError(t, err, "an expired key is free for any request")
		require.False(t, replayed)
		require.NotEqual(t, first, third)
		require.Equal(t, 2, e.effects(t, "k"))
		require.Equal(t, 1, e.records(t, "k"))
	})
}

// expireBound is what the cleanup promises: no batch of expireBatch rows
// holds its transaction longer than this, as the server reports it.
const (
	expireBatch = 1000
	expireBound = 2 * time.Second // 650ms seen on MariaDB at load 5: room for CI's load
)

// 100,000 expired records go in batches, none of which holds a transaction
// longer than expireBound; the live records stay.
func TestExpireInShortBatches(t *testing.T) {
	for _, driver := range []string{"pgx", testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, driver)
			ctx := t.Context()
			s := e.store(t, idempotency.Config{})
			for i := range 10 {
				key := fmt.Sprintf("live-%d", i)
				_, _, err := s.Do(ctx, key, "fp", e.effect(key, "fp"))
				require.NoError(t, err)
			}
			const expired = 100_000
			fill := `INSERT INTO idem (id, fingerprint, state, answer, fence, expires_at)
				SELECT 'old-' || g, 'fp', 1, NULL, 0, now() - interval '1 hour' FROM generate_series(1, 100000) g`
			if e.dialect == sqldb.MySQL {
				fill = `INSERT INTO idem (id, fingerprint, state, answer, fence, expires_at)
					SELECT CONCAT('old-', seq), 'fp', 1, NULL, 0, NOW(6) - INTERVAL 1 HOUR FROM seq_1_to_100000`
			}
			_, err := e.own.ExecContext(ctx, fill)
			require.NoError(t, err)

			longest, samples, stop := sampleLongestTx(t, e)
			began := time.Now()
			removed, err := s.Expire(ctx, expireBatch)
			took := time.Since(began)
			stop()
			require.NoError(t, err)
			require.EqualValues(t, expired, removed)
			var left int
			require.NoError(t, e.own.Get(&left, `SELECT count(*) FROM idem`))
			require.Equal(t, 10, left, "the live records stay")
			t.Logf("%s: removed %d in %v, batches of %d; longest transaction the server showed: %v (%d samples)",
				driver, removed, took, expireBatch, *longest, *samples)
			require.Positive(t, *samples)
			require.Less(t, *longest, expireBound)
		})
	}
}

// sampleLongestTx polls the server, every 25ms until stop, for the age of
// the oldest open transaction that is deleting from idem, and keeps the
// largest seen.
func sampleLongestTx(t *testing.T, e *env) (longest *time.Duration, samples *int, stop func()) {
	query := `SELECT coalesce(max(extract(epoch from clock_timestamp() - xact_start)), 0)
		FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'DELETE FROM "idem"%' AND xact_start IS NOT NULL`
	if e.dialect == sqldb.MySQL {
		// Each batch is a statement in autocommit, its own transaction:
		// the statement's age is the transaction's. (innodb_trx's
		// trx_started counts whole seconds, and MariaDB keeps a session's
		// from an earlier statement.)
		query = `SELECT coalesce(max(TIME_MS), 0) / 1000
			FROM information_schema.PROCESSLIST WHERE INFO LIKE 'DELETE FROM ` + "`idem`" + `%'`
	}
	longest, samples = new(time.Duration), new(int)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		// Not faster: MariaDB 10.11 once crashed (signal 11) while this
		// read of PROCESSLIST ran beside hundreds of sessions ending.
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var secs float64
			if err := e.own.GetContext(ctx, &secs, query); err != nil {
				if ctx.Err() == nil {
					t.Errorf("sample: %v", err)
				}
				return
			}
			*samples++
			*longest = max(*longest, time.Duration(secs*float64(time.Second)))
		}
	})
	return longest, samples, func() { cancel(); wg.Wait() }
}

// With an Observer, Expire reports each record it removes, and no other:
// the keys whose retention ended, in batches smaller than their number.
func TestExpireReportsEachRecord(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		var ev events
		short := e.store(t, idempotency.Config{Retention: time.Millisecond, Observer: &ev})
		long := e.store(t, idempotency.Config{Observer: &ev})
		want := map[string]bool{}
		for i := range 5 {
			key := fmt.Sprintf("short-%d", i)
			_, _, err := short.Do(ctx, key, "fp", e.effect(key, "fp"))
			require.NoError(t, err)
			want[key] = true
		}
		_, _, err := long.Do(ctx, "long", "fp", e.effect("long", "fp"))
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond)
		ev.take()

		removed, err := long.Expire(ctx, 2)
		require.NoError(t, err)
		require.EqualValues(t, 5, removed)
		got := map[string]bool{}
		for _, g := range ev.take() {
			require.Equal(t, contend.EventExpired, g.Kind)
			require.Equal(t, contend.StrategyIdempotency, g.Strategy)
			require.Positive(t, g.Fence)
			require.False(t, got[g.Key], "%s reported twice", g.Key)
			got[g.Key] = true
		}
		require.Equal(t, want, got)
		require.Equal(t, 1, e.records(t, "long"), "the live record stays")

		removed, err = long.Expire(ctx, 0)
		require.NoError(t, err)
		require.Zero(t, removed)
		require.Empty(t, ev.take())
	})
}

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/harness"
	"github.com/contend/contend/internal/testserver"
)

// storm is 3 processes of 32 goroutines each, every goroutine calling every
// key once, in the same order, so that 96 callers race for each key in turn.
var storm = harness.Config{Processes: 3, Goroutines: 32, Ops: len(stormKeys), Keys: stormKeys}

var stormKeys = func() []string {
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	return keys
}()

// errMismatchSeen is what an op returns for a mismatch it checked: the
// harness counts it as a conflict.
var errMismatchSeen = fmt.Errorf("mismatch, as expected: %w", contend.ErrConflict)

// fingerprint picks the request a caller sends: one in six sends another
// payload under the same key.
func fingerprint() string {
	if rand.IntN(6) == 0 {
		return "other"
	}
	return "fp"
}

// stormUnder runs the storm with newOp's operation and returns the result
// and the env of the parent.
func stormUnder(t *testing.T, driver string, newOp func(t testing.TB, e *env) harness.Op) (harness.Result, *env) {
	var e *env
	res := harness.Run(t, storm,
		func() harness.Params {
			e = newEnv(t, driver)
			return harness.Params{"url": e.url}
		},
		func(t testing.TB, p harness.Params) harness.Op {
			return newOp(t, reopen(t, driver, p["url"]))
		})
	require.Empty(t, res.Stalled)
	return res, e
}

// check is what every caller checks as soon as its call returns: the key's
// one effect is committed by then, and the caller's answer, or its
// mismatch, must agree with it.
func check(ctx context.Context, e *env, key, fp string, answer []byte, err error) error {
	var effFP, effAnswer string
	if qerr := e.own.QueryRowxContext(ctx, e.q(`SELECT fingerprint, answer FROM effects WHERE k = $1 ORDER BY n LIMIT 1`), key).Scan(&effFP, &effAnswer); qerr != nil {
		return fmt.Errorf("read the effect of %s after the call returned (%v): %w", key, err, qerr)
	}
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		if effFP == fp {
			return fmt.Errorf("%s: mismatch for the fingerprint that has the effect", key)
		}
		return errMismatchSeen
	case err != nil:
		return err
	case effFP != fp:
		return fmt.Errorf("%s: an answer for fingerprint %s, whose effect is %s's", key, fp, effFP)
	case string(answer) != effAnswer:
		return fmt.Errorf("%s: answer %q, the effect's is %q", key, answer, effAnswer)
	}
	return nil
}

// Every driver: exactly one effect per key, every caller with the winning
// fingerprint gets the one answer, every other caller ErrMismatch.
func TestStormOneEffectPerKey(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			res, e := stormUnder(t, driver, func(t testing.TB, e *env) harness.Op {
				s := e.store(t, idempotency.Config{})
				return func(ctx context.Context, key string) error {
					fp := fingerprint()
					answer, _, err := s.Do(ctx, key, fp, e.effect(key, fp))
					return check(ctx, e, key, fp, answer, err)
				}
			})
			t.Logf("%s: %d calls: %d answered, %d mismatches, %d errors; p50 %v, p99 %v", driver,
				res.Total(), res.Successes, res.Conflicts, res.Errors, res.Percentile(.5), res.Percentile(.99))
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			require.Equal(t, storm.Processes*storm.Goroutines*len(stormKeys), res.Total())
			require.Positive(t, res.Conflicts, "some callers sent another payload")
			for _, key := range stormKeys {
				require.Equal(t, 1, e.effects(t, key), "effects of %s", key)
				require.Equal(t, 1, e.records(t, key), "records of %s", key)
			}
		})
	}
}

// DoExternal under the same storm, its effect outside any transaction (a
// write in autocommit, as a call to another service would be): with no call
// stalling past its lease, every key still has exactly one effect, and
// every caller the one answer or ErrMismatch.
func TestStormExternalOneEffectPerKey(t *testing.T) {
	for _, driver := range []string{"pgx", testserver.MariaDBDriver} {
		t.Run(driver, func(t *testing.T) {
			res, e := stormUnder(t, driver, func(t testing.TB, e *env) harness.Op {
				s := e.store(t, idempotency.Config{})
				return func(ctx context.Context, key string) error {
					fp := fingerprint()
					answer, _, err := s.DoExternal(ctx, key, fp, func(ctx context.Context, _ int64) ([]byte, error) {
						answer := fmt.Sprintf("%s/%s/%d", key, fp, rand.Int64())
						_, err := e.own.ExecContext(ctx, e.q(`INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`), key, fp, answer)
						return []byte(answer), err
					})
					if errors.Is(err, idempotency.ErrMismatch) {
						// Refused while the key's call may still be in
						// flight, its effect not made yet: the record
						// that refused it is committed, and names the
						// other request.
						var recFP string
						if qerr := e.own.GetContext(ctx, &recFP, e.q(`SELECT fingerprint FROM idem WHERE id = $1`), key); qerr != nil {
							return qerr
						}
						if recFP == fp {
							return fmt.Errorf("%s: mismatch for the fingerprint that holds the key", key)
						}
						return errMismatchSeen
					}
					return check(ctx, e, key, fp, answer, err)
				}
			})
			t.Logf("%s: %d calls: %d answered, %d mismatches, %d errors; p50 %v, p99 %v", driver,
				res.Total(), res.Successes, res.Conflicts, res.Errors, res.Percentile(.5), res.Percentile(.99))
			require.Zero(t, res.Errors, "%v", res.FirstErrors)
			for _, key := range stormKeys {
				require.Equal(t, 1, e.effects(t, key), "effects of %s", key)
			}
		})
	}
}

// The negative control: check, then insert, without the library, under the
// same storm, runs some keys' effect more than once, so the test above can
// fail.
func TestStormCheckThenInsertDuplicates(t *testing.T) {
	res, e := stormUnder(t, "pgx", func(t testing.TB, e *env) harness.Op {
		return func(ctx context.Context, key string) error {
			var n int
			if err := e.own.GetContext(ctx, &n, `SELECT count(*) FROM effects WHERE k = $1`, key); err != nil {
				return err
			}
			if n > 0 {
				return nil // "already done"
			}
			_, err := e.writeEffect(ctx, key, "fp")
			return err
		}
	})
	require.Zero(t, res.Errors, "%v", res.FirstErrors)
	dup := 0
	for _, key := range stormKeys {
		if n := e.effects(t, key); n > 1 {
			dup += n - 1
		}
	}
	t.Logf("%d calls on %d keys: %d duplicate effects", res.Total(), len(stormKeys), dup)
	require.Positive(t, dup, "without the library some keys must have their effect twice")
}

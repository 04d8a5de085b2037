package guardtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/history"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/waitfor"
)

// writesTable records the writes of [CarelessNesting]'s calls, one row per
// write.
const writesTable = "guardtest_writes"

// callBound is the ctx of each call of [CarelessNesting]: long enough for
// PostgreSQL to find the deadlock (deadlock_timeout, 1s by default) and for
// the victim to run again.
const callBound = 30 * time.Second

// CarelessNesting runs rounds of two calls of s's guard whose fns cross: each
// writes, locks its own key's counter row (an UPDATE through the guard's
// querier), waits for the other to have done the same, then locks the
// other's row, and writes again, whatever that lock answered: a careless
// caller that takes a lost race for a busy key and goes on. The lock is
// nest's Do on the other key, whose fn writes too, or, when nest is nil, a
// plain UPDATE of the other's row through the querier.
//
// Inside transactions the two wait for each other and the server breaks the
// deadlock: InnoDB rolls the victim's whole transaction back, PostgreSQL
// aborts it. Whatever the caller did next, each outer call must tell the
// truth: either all of its writes are committed or none, and nil means all.
// A guard whose fn runs outside any transaction commits each write at once,
// takes no lock across statements, and keeps that promise trivially.
//
// It returns how many times a nested lock failed, over every run of fn, and
// how many outer calls failed.
func CarelessNesting(t *testing.T, s Suite, rounds int, nest func(t testing.TB, env Env) contend.Guard) (nestedFailed, failed int) {
	env := open(t, s.Driver, testserver.URL(t, s.Driver), "")
	own := keys(2)
	setup(t, s, env, own)
	_, err := env.DB.Exec(`CREATE TABLE ` + writesTable + ` (op varchar(64) NOT NULL, step int NOT NULL)`)
	require.NoError(t, err)
	g := newGuard(t, s, env)
	var inner contend.Guard
	if nest != nil {
		inner = nest(t, env)
	}
	p := env.Dialect.Param
	var (
		insert = `INSERT INTO ` + writesTable + ` (op, step) VALUES (` + p(1) + `, ` + p(2) + `)`
		lock   = `UPDATE ` + counterTable + ` SET n = n + 1 WHERE ` + counterKey(env) + ` = ` + p(1)
	)

	type call struct {
		op           string
		err          error
		wrote        int   // the writes of fn's last run, as fn saw them
		nested       error // what the nested lock answered in fn's last run
		nestedFailed int   // over every run
	}
	for r := range rounds {
		var arrived sync.WaitGroup
		arrived.Add(2)
		both := make(chan struct{})
		go func() { arrived.Wait(); close(both) }()
		calls := [2]*call{}
		var wg sync.WaitGroup
		for i := range calls {
			c := &call{op: fmt.Sprintf("r%d-%d", r, i)}
			calls[i] = c
			mine, other := own[i], own[1-i]
			var runs atomic.Int32
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), callBound)
				defer cancel()
				c.err = g.Do(ctx, mine, func(ctx context.Context) error {
					q := testserver.Querier(ctx, env.Handle)
					c.wrote, c.nested = 0, nil
					write := func(ctx context.Context, step int) error {
						_, err := testserver.Querier(ctx, env.Handle).Exec(ctx, insert, c.op, step)
						if err == nil {
							c.wrote++
						}
						return err
					}
					if err := write(ctx, 1); err != nil {
						return err
					}
					if _, err := q.Exec(ctx, lock, mine); err != nil {
						return err
					}
					if runs.Add(1) == 1 {
						// The first run waits for the other call to hold its
						// row, or for a guard that runs the two one after
						// the other to show it does.
						arrived.Done()
						select {
						case <-both:
						case <-time.After(2 * time.Second):
						}
					}
					if inner != nil {
						c.nested = inner.Do(ctx, other, func(ctx context.Context) error { return write(ctx, 2) })
					} else if _, c.nested = q.Exec(ctx, lock, other); c.nested == nil {
						c.nested = write(ctx, 2)
					}
					if c.nested != nil {
						c.nestedFailed++
					}
					// Careless: the nested answer is ignored.
					return write(ctx, 3)
				})
			})
		}
		waitfor.Wait(t, &wg, callBound+waitfor.Grace, "careless_nesting: a crossing call did not return after its ctx ended")
		for _, c := range calls {
			var n int
			require.NoError(t, env.DB.Get(&n, `SELECT count(*) FROM `+writesTable+` WHERE op = `+p(1), c.op))
			nestedFailed += c.nestedFailed
			if c.err != nil {
				failed++
				require.Zero(t, n, "call %s failed (%v) but %d of its writes were committed (its nested lock answered %v)", c.op, c.err, n, c.nested)
				continue
			}
			require.Equal(t, c.wrote, n, "call %s answered nil, its fn wrote %d rows, and %d were committed (its nested lock answered %v)", c.op, c.wrote, n, c.nested)
		}
	}
	t.Logf("%d rounds: %d nested locks failed, %d outer calls failed", rounds, nestedFailed, failed)
	return nestedFailed, failed
}

// counterKey is the key column of the counter table, quoted for env's
// server.
func counterKey(env Env) string {
	if env.Dialect.Param(1) == "?" {
		return "`key`"
	}
	return "key"
}

// oneSession builds the guard on one connection of the suite's pool, which
// is one server session, and checks that it is refused with an error
// matching [contend.ErrInvalid] that says to pass the pool. A guard that
// took it would begin two callers' transactions on one session, where a row
// lock does not keep them apart. A guard that accepts one fails the check,
// after two goroutines ran increments through it, to show what it did: an
// increment lost, two fns inside an exclusive guard at once.
func oneSession(t *testing.T, s Suite) {
	env := open(t, s.Driver, testserver.URL(t, s.Driver), "")
	key := keys(1)[0]
	setup(t, s, env, []string{key})
	session := env
	session.Handle = testserver.Session(t, env.Handle)
	g, err := s.NewOn(env, session.Handle)
	if err != nil {
		require.ErrorIs(t, err, contend.ErrInvalid)
		require.ErrorContains(t, err, "pool", "the error says what to pass instead")
		return
	}
	if c, ok := g.(interface{ Close() error }); ok {
		t.Cleanup(func() { _ = c.Close() })
	}
	const goroutines, ops = 2, 20
	var (
		wg        sync.WaitGroup
		successes atomic.Int64
		errs      = make(chan error, goroutines*ops)
	)
	for range goroutines {
		wg.Go(func() {
			for range ops {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				err := g.Do(ctx, key, func(ctx context.Context) error {
					return increment(ctx, session, key, &history.Call{})
				})
				cancel()
				if err != nil {
					errs <- err
					continue
				}
				successes.Add(1)
			}
		})
	}
	waitfor.Wait(t, &wg, ops*10*time.Second+waitfor.Grace, "one_session: a call through one session did not return after its ctx ended")
	close(errs)
	var first []error
	for err := range errs {
		first = append(first, err)
	}
	var n int64
	require.NoError(t, env.DB.Get(&n, counterStatements(env.Dialect).get, key))
	overlaps, err := env.Redis.Get(t.Context(), env.Prefix+"overlaps").Int64()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
	}
	t.Logf("a guard on one session was accepted: %d calls succeeded, the counter shows %d, %d overlaps, %d errors %v",
		successes.Load(), n, overlaps, len(first), first[:min(2, len(first))])
	require.Equal(t, successes.Load(), n, "through one session, the counter does not show the calls that succeeded")
	if s.Exclusive {
		require.Zero(t, overlaps, "two fns were inside an exclusive guard at once through one session")
	}
	t.Fatal("a guard on one session was accepted: every SQL guard refuses one, so that all of them agree")
}

// TimedOutLock runs rounds of one call of s's guard, on the server at url,
// whose fn writes, locks its own key's counter row, then waits for a lock
// that a transaction of the test holds past the server's lock wait timeout,
// and writes again, whatever that lock answered: a careless caller. The lock
// is nest's Do on the held key, whose fn writes too, or, when nest is nil, a
// plain UPDATE of its row through the querier. The test's transaction lets
// go of the row once the first wait has timed out, so that a guard that runs
// fn again finds it free.
//
// It is for a MySQL or MariaDB server started with
// innodb_rollback_on_timeout=ON and a short innodb_lock_wait_timeout (see
// testserver.OwnMariaDB): the lock wait timeout (1205) then rolls the
// whole transaction back, as a deadlock does, and its writes so far are
// gone; a statement after it would run alone in autocommit. The call must
// tell the truth: either all of its writes are committed or none, and nil
// means all (of fn's last run). It returns how many outer calls failed.
func TimedOutLock(t *testing.T, s Suite, url string, rounds int, nest func(t testing.TB, env Env) contend.Guard) (failed int) {
	env := open(t, s.Driver, url, "")
	own := keys(2)
	mine, held := own[0], own[1]
	setup(t, s, env, own)
	_, err := env.DB.Exec(`CREATE TABLE ` + writesTable + ` (op varchar(64) NOT NULL, step int NOT NULL)`)
	require.NoError(t, err)
	g := newGuard(t, s, env)
	var inner contend.Guard
	if nest != nil {
		inner = nest(t, env)
	}
	p := env.Dialect.Param
	var (
		insert = `INSERT INTO ` + writesTable + ` (op, step) VALUES (` + p(1) + `, ` + p(2) + `)`
		lock   = `UPDATE ` + counterTable + ` SET n = n + 1 WHERE ` + counterKey(env) + ` = ` + p(1)
	)
	for r := range rounds {
		op := fmt.Sprintf("r%d", r)
		holder, err := env.DB.BeginTxx(t.Context(), nil)
		require.NoError(t, err)
		_, err = holder.Exec(lock, held)
		require.NoError(t, err)
		var letGo sync.Once
		release := func() { letGo.Do(func() { require.NoError(t, holder.Rollback()) }) }

		var (
			wrote    int   // the writes of fn's last run, as fn saw them
			nested   error // what the held lock answered in fn's last run
			timedOut int   // the held lock's failures, over every run
		)
		ctx, cancel := context.WithTimeout(t.Context(), callBound)
		err = g.Do(ctx, mine, func(ctx context.Context) error {
			q := testserver.Querier(ctx, env.Handle)
			wrote, nested = 0, nil
			write := func(ctx context.Context, step int) error {
				_, err := testserver.Querier(ctx, env.Handle).Exec(ctx, insert, op, step)
				if err == nil {
					wrote++
				}
				return err
			}
			if err := write(ctx, 1); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, lock, mine); err != nil {
				return err
			}
			if inner != nil {
				nested = inner.Do(ctx, held, func(ctx context.Context) error { return write(ctx, 2) })
			} else if _, nested = q.Exec(ctx, lock, held); nested == nil {
				nested = write(ctx, 2)
			}
			if nested != nil {
				timedOut++
				release()
			}
			// Careless: the answer is ignored.
			return write(ctx, 3)
		})
		cancel()
		release()
		require.Positive(t, timedOut, "round %d: the lock on the held row never timed out", r)

		var n int
		require.NoError(t, env.DB.Get(&n, `SELECT count(*) FROM `+writesTable+` WHERE op = `+p(1), op))
		if r == 0 {
			t.Logf("call %s answered %v; the held lock timed out %d times, and answered %v last", op, err, timedOut, nested)
		}
		if err != nil {
			failed++
			require.Zero(t, n, "call %s failed (%v) but %d of its writes were committed (the held lock answered %v)", op, err, n, nested)
			continue
		}
		require.Equal(t, wrote, n, "call %s answered nil, its fn wrote %d rows, and %d were committed (the held lock answered %v)", op, wrote, n, nested)
	}
	t.Logf("%d rounds: %d outer calls failed", rounds, failed)
	return failed
}

package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
)

// The first call runs fn and stores its answer with its effect; the second
// replays it without running fn; another request with the key is refused.
func TestDoOnceThenReplay(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		first, replayed, err := s.Do(ctx, "k1", "fp", e.effect("k1", "fp"))
		require.NoError(t, err)
		require.False(t, replayed)
		require.NotEmpty(t, first)

		again, replayed, err := s.Do(ctx, "k1", "fp", func(context.Context) ([]byte, error) {
			t.Error("fn ran on a replay")
			return nil, nil
		})
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, first, again)

		_, _, err = s.Do(ctx, "k1", "other", func(context.Context) ([]byte, error) {
			t.Error("fn ran on a mismatch")
			return nil, nil
		})
		require.ErrorIs(t, err, idempotency.ErrMismatch)
		require.NotErrorIs(t, err, contend.ErrConflict)
		require.Equal(t, 1, e.effects(t, "k1"))
	})
}

// A final error (the default) rolls fn's writes back and is replayed; a
// transient one leaves nothing, and the next call runs fn.
func TestErrorsFinalAndTransient(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		declined := errors.New("card declined")
		_, _, err := s.Do(ctx, "final", "fp", func(ctx context.Context) ([]byte, error) {
			_, err := e.writeEffect(ctx, "final", "fp")
			require.NoError(t, err)
			return nil, declined
		})
		require.ErrorIs(t, err, idempotency.ErrFailed)
		require.ErrorIs(t, err, declined, "the call that ran fn keeps fn's error")
		require.Zero(t, e.effects(t, "final"), "a final error's writes roll back")
		_, replayed, again := s.Do(ctx, "final", "fp", func(context.Context) ([]byte, error) {
			t.Error("fn ran after a final error")
			return nil, nil
		})
		require.True(t, replayed)
		require.ErrorIs(t, again, idempotency.ErrFailed)
		require.Equal(t, err.Error(), again.Error(), "the replay says what the first call said")

		busy := errors.New("upstream busy")
		_, _, err = s.Do(ctx, "transient", "fp", func(ctx context.Context) ([]byte, error) {
			_, err := e.writeEffect(ctx, "transient", "fp")
			require.NoError(t, err)
			return nil, idempotency.Transient(busy)
		})
		require.ErrorIs(t, err, busy)
		require.NotErrorIs(t, err, idempotency.ErrFailed)
		require.Zero(t, e.effects(t, "transient"))
		require.Zero(t, e.records(t, "transient"))
		_, replayed, err = s.Do(ctx, "transient", "fp", e.effect("transient", "fp"))
		require.NoError(t, err)
		require.False(t, replayed, "after a transient error fn runs again")
		require.Equal(t, 1, e.effects(t, "transient"))
	})
}

// A duplicate in flight is waited for, then replayed; if the first rolls
// back, the duplicate runs fn itself. Under NoWait it is refused at once.
func TestDuplicateInFlight(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		for _, iso := range isolations(e) {
			t.Logf("isolation %v", iso)
			ctx := t.Context()
			s := e.store(t, idempotency.Config{Isolation: iso})
			for _, rollback := range []bool{false, true} {
				key := "wait-" + iso.String() + map[bool]string{false: "-commit", true: "-rollback"}[rollback]
				started, release := make(chan struct{}), make(chan struct{})
				type result struct {
					answer   []byte
					replayed bool
					err      error
				}
				firstDone := make(chan result, 1)
				go func() {
					a, r, err := s.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
						a, err := e.writeEffect(ctx, key, "fp")
						close(started)
						<-release
						if rollback {
							return nil, idempotency.Transient(errors.New("first gives up"))
						}
						return a, err
					})
					firstDone <- result{a, r, err}
				}()
				<-started
				second := make(chan result, 1)
				go func() {
					a, r, err := s.Do(ctx, key, "fp", e.effect(key, "fp"))
					second <- result{a, r, err}
				}()
				select {
				case r := <-second:
					t.Fatalf("the duplicate returned while the first was in flight: %+v", r)
				case <-time.After(500 * time.Millisecond):
				}
				// NoWait: answered at once.
				nw := e.store(t, idempotency.Config{NoWait: true, Isolation: iso})
				began := time.Now()
				_, _, err := nw.Do(ctx, key, "fp", e.effect(key, "fp"))
				require.ErrorIs(t, err, idempotency.ErrInFlight)
				require.ErrorIs(t, err, contend.ErrConflict)
				require.Less(t, time.Since(began), 3*time.Second)

				close(release)
				f, sr := <-firstDone, <-second
				require.NoError(t, sr.err)
				if rollback {
					require.Error(t, f.err)
					require.False(t, sr.replayed, "the first rolled back: the duplicate ran fn")
				} else {
					require.NoError(t, f.err)
					require.True(t, sr.replayed)
					require.Equal(t, f.answer, sr.answer)
				}
				require.Equal(t, 1, e.effects(t, key))
			}
		}
	})
}

// A final error while a duplicate waits: the first call's transaction rolls
// back and its error is recorded in another, so the duplicate may take the
// key in between and run fn. Either way both callers get the one answer
// the key keeps, and the effects agree with it.
func TestFinalErrorWhileDuplicateWaits(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		declined := errors.New("card declined")
		for i := range 3 {
			key := fmt.Sprintf("declined-%d", i)
			started, release := make(chan struct{}), make(chan struct{})
			type result struct {
				answer   []byte
				replayed bool
				err      error
			}
			first := make(chan result, 1)
			go func() {
				a, r, err := s.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
					close(started)
					<-release
					return nil, declined
				})
				first <- result{a, r, err}
			}()
			<-started
			second := make(chan result, 1)
			go func() {
				a, r, err := s.Do(ctx, key, "fp", e.effect(key, "fp"))
				second <- result{a, r, err}
			}()
			time.Sleep(100 * time.Millisecond) // the duplicate waits on the key
			close(release)
			f, d := <-first, <-second
			if errors.Is(f.err, idempotency.ErrFailed) {
				// The failure was recorded first: the duplicate replays it.
				require.ErrorIs(t, f.err, declined)
				require.True(t, d.replayed)
				require.ErrorIs(t, d.err, idempotency.ErrFailed)
				require.Zero(t, e.effects(t, key))
			} else {
				// The duplicate took the key and ran fn: the first call
				// answers with its answer.
				require.NoError(t, f.err)
				require.NoError(t, d.err)
				require.True(t, f.replayed)
				require.False(t, d.replayed)
				require.Equal(t, d.answer, f.answer)
				require.Equal(t, 1, e.effects(t, key))
			}
			require.Equal(t, 1, e.records(t, key))
			_, replayed, err := s.Do(ctx, key, "fp", e.effect(key, "fp"))
			require.True(t, replayed, "later calls replay what the key keeps")
			if f.err != nil {
				require.Equal(t, f.err.Error(), err.Error())
			} else {
				require.NoError(t, err)
			}
		}
	})
}

// isolations are the levels the store is checked at: READ COMMITTED, and
// REPEATABLE READ, where MySQL's plain reads come from a snapshot (the
// store's read after the wait locks, and so sees the latest commit) and
// PostgreSQL's insert, finding a row its snapshot cannot see, fails to
// serialize and runs again with a new snapshot.
func isolations(*env) []sql.IsolationLevel {
	return []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead}
}

func TestNewRefusesBadInput(t *testing.T) {
	e := &env{db: nil}
	_, err := idempotency.New(e.db, idempotency.Config{Table: "idem"})
	require.ErrorIs(t, err, contend.ErrInvalid)
	db := newEnv(t, "pgx").db
	for _, cfg := range []idempotency.Config{
		{},
		{Table: "idem; DROP TABLE x"},
		{Table: "idem", KeyColumn: "fingerprint"},
		{Table: "idem", Retention: -time.Second},
		{Table: "idem", Lease: -time.Second},
	} {
		_, err := idempotency.New(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, "%+v", cfg)
	}
	s, err := idempotency.New(db, idempotency.Config{Table: "idem"})
	require.NoError(t, err)
	_, _, err = s.Do(t.Context(), "", "fp", func(context.Context) ([]byte, error) { return nil, nil })
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, _, err = s.Do(t.Context(), "k", "fp", nil)
	require.ErrorIs(t, err, contend.ErrInvalid)
}

// A Do nested in another's fn joins its transaction; a final error of the
// outer fn rolls back everything the outer fn did, the inner Do included.
func TestNestedDoRollsBackWithTheOuterFinalError(t *testing.T) {
	forDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		s := e.store(t, idempotency.Config{})
		_, _, err := s.Do(ctx, "outer", "fp", func(ctx context.Context) ([]byte, error) {
			if _, err := e.writeEffect(ctx, "outer", "fp"); err != nil {
				return nil, err
			}
			if _, _, err := s.Do(ctx, "inner", "fp", e.effect("inner", "fp")); err != nil {
				return nil, err
			}
			return nil, errors.New("out of stock")
		})
		require.ErrorIs(t, err, idempotency.ErrFailed)
		require.Zero(t, e.effects(t, "outer"))
		require.Zero(t, e.effects(t, "inner"))
		require.Zero(t, e.records(t, "inner"), "the inner record rolled back with the outer fn")
		require.Equal(t, 1, e.records(t, "outer"), "the outer final error is stored")
	})
}

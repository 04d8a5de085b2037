package optimistic_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
)

// The parallel tests wait on locks, leases, ctx deadlines and the fault
// suite's timers, each on a pool of a few connections: four at a time.
func TestMain(m *testing.M) { testserver.MainWaiting(m, 4) }

type account struct {
	ID      string `db:"id"`
	Owner   string `db:"owner"`
	Balance int64  `db:"balance"`
	Version int64  `db:"version"`
}

// accounts creates the accounts table with a row of balance 100 for each id.
// The CHECK makes an overdraft an error rather than a silent pass.
func accounts(t testing.TB, db *sqlx.DB, ids ...string) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE accounts (
		id text PRIMARY KEY,
		owner text NOT NULL DEFAULT '',
		balance bigint NOT NULL CHECK (balance >= 0),
		version bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	for _, id := range ids {
		_, err := db.Exec(`INSERT INTO accounts (id, owner, balance) VALUES ($1, 'ann', 100)`, id)
		require.NoError(t, err)
	}
}

var accountsConfig = optimistic.Config{Table: "accounts"}

func accountStore(t testing.TB, db contend.DB, cfg optimistic.Config) *optimistic.Store[account] {
	t.Helper()
	s, err := optimistic.NewStore[account](db, cfg)
	require.NoError(t, err)
	return s
}

func rowOf(t testing.TB, db *sqlx.DB, id string) account {
	t.Helper()
	var a account
	require.NoError(t, db.Get(&a, `SELECT * FROM accounts WHERE id = $1`, id))
	return a
}

// observed is a Config.Observer that keeps every event.
type observed struct {
	mu     sync.Mutex
	events []contend.Event // protected by mu
}

func (o *observed) Observe(_ context.Context, e contend.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

// last returns the attempts of the last call that ended.
func (o *observed) last() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.events) - 1; i >= 0; i-- {
		if o.events[i].Kind != contend.EventRetry {
			return o.events[i].Attempts
		}
	}
	return 0
}

// take returns the events reported since the last take.
func (o *observed) take() []contend.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	events := o.events
	o.events = nil
	return events
}

func TestGetInsert(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			accounts(t, db, "a")
			s := accountStore(t, h, accountsConfig)
			ctx := t.Context()

			got, err := s.Get(ctx, "a")
			require.NoError(t, err)
			require.Equal(t, account{ID: "a", Owner: "ann", Balance: 100, Version: 0}, got)

			_, err = s.Get(ctx, "ghost")
			require.ErrorIs(t, err, contend.ErrNotFound)

			b := account{ID: "b", Owner: "bob", Balance: 5}
			require.NoError(t, s.Insert(ctx, &b))
			require.Equal(t, b, rowOf(t, db, "b"))

			dup := account{ID: "b", Owner: "eve", Balance: 1000}
			err = s.Insert(ctx, &dup)
			require.ErrorIs(t, err, contend.ErrConflict, "insert of an existing key")
			require.Equal(t, b, rowOf(t, db, "b"), "the existing row is untouched")

			_, err = s.Get(ctx, "a' OR '1'='1")
			require.ErrorIs(t, err, contend.ErrNotFound, "keys are values, never SQL")
		})
	}
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.AllDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url := testserver.Postgres(t)
			db := testserver.Open(t, driver, url)
			h := testserver.Handle(t, driver, url)
			accounts(t, db, "a")
			var obs observed
			s := accountStore(t, h, optimistic.Config{Table: "accounts", Observer: &obs})
			ctx := t.Context()

			got, err := s.Update(ctx, "a", func(a *account) error {
				a.Balance -= 30
				a.Owner = "ann b."
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, account{ID: "a", Owner: "ann b.", Balance: 70, Version: 1}, got)
			require.Equal(t, got, rowOf(t, db, "a"))
			require.Equal(t, 1, obs.last(), "an uncontended update takes one attempt")

			// fn's error aborts the update unchanged, and nothing is written.
			refused := errors.New("refused")
			_, err = s.Update(ctx, "a", func(a *account) error {
				a.Balance = 0
				return refused
			})
			require.Equal(t, refused, err, "fn's error is returned as it is")
			require.Equal(t, got, rowOf(t, db, "a"))

			// fn's error is not mistaken for the store's, even when it
			// matches one of contend's sentinels.
			notMine := errors.Join(errors.New("other row"), contend.ErrNotFound)
			_, err = s.Update(ctx, "a", func(*account) error { return notMine })
			require.Equal(t, notMine, err)

			_, err = s.Update(ctx, "ghost", func(*account) error { t.Error("fn ran for a missing row"); return nil })
			require.ErrorIs(t, err, contend.ErrNotFound)
			require.NotErrorIs(t, err, contend.ErrConflict)

			// The key and version are the store's: fn cannot move them.
			got, err = s.Update(ctx, "a", func(a *account) error {
				a.ID, a.Version = "elsewhere", 99
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, "a", got.ID)
			require.EqualValues(t, 2, got.Version)
			require.Equal(t, got, rowOf(t, db, "a"))
		})
	}
}

// A writer that changes the row between Update's read and write makes Update
// read again and run fn again; the interloper's write survives.
func TestUpdateRetriesWhenTheVersionMoved(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	var obs observed
	s := accountStore(t, db, optimistic.Config{Table: "accounts", Observer: &obs})
	other := accountStore(t, db, accountsConfig)
	ctx := t.Context()

	var seen []int64
	got, err := s.Update(ctx, "a", func(a *account) error {
		seen = append(seen, a.Balance)
		if len(seen) == 1 {
			// Another writer gets in between this attempt's read and write.
			_, err := other.Update(ctx, "a", func(a *account) error { a.Balance -= 50; return nil })
			require.NoError(t, err)
		}
		a.Balance -= 30
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []int64{100, 50}, seen, "the second attempt reads the other writer's balance")
	require.EqualValues(t, 20, got.Balance, "both withdrawals count")
	require.EqualValues(t, 2, got.Version)
	require.Equal(t, 2, obs.last())
	require.Equal(t, got, rowOf(t, db, "a"))
}

// When every attempt loses, Update gives up with ErrConflict; when the row
// was deleted meanwhile, with ErrNotFound.
func TestUpdateGivesUp(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	accounts(t, db, "a", "b")
	var obs observed
	s := accountStore(t, db, optimistic.Config{Table: "accounts", Retry: contend.Retry{MaxAttempts: 3, BaseDelay: time.Microsecond}, Observer: &obs})
	ctx := t.Context()

	runs := 0
	_, err := s.Update(ctx, "a", func(a *account) error {
		runs++
		_, err := db.ExecContext(ctx, `UPDATE accounts SET version = version + 1 WHERE id = 'a'`)
		require.NoError(t, err)
		a.Balance = 0
		return nil
	})
	require.ErrorIs(t, err, contend.ErrConflict)
	require.ErrorContains(t, err, "a", "the conflict names its key")
	require.Equal(t, 3, runs)
	require.Equal(t, 3, obs.last())
	require.EqualValues(t, 100, rowOf(t, db, "a").Balance, "no attempt wrote")

	_, err = s.Update(ctx, "b", func(a *account) error {
		_, err := db.ExecContext(ctx, `DELETE FROM accounts WHERE id = 'b'`)
		require.NoError(t, err)
		return nil
	})
	require.ErrorIs(t, err, contend.ErrNotFound, "a deleted row is not a lost race")
	require.NotErrorIs(t, err, contend.ErrConflict)
}

// The caller's value carries the new version after each write, so writing it
// again does not conflict with itself (GORM's optimistic-lock plugin gets this
// wrong: the second save of the same value fails).
func TestValueCarriesItsNewVersion(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			accounts(t, db, "a")
			s := accountStore(t, db, accountsConfig)
			ctx := t.Context()

			a, err := s.Get(ctx, "a")
			require.NoError(t, err)
			a.Balance = 90
			require.NoError(t, s.Save(ctx, &a))
			require.EqualValues(t, 1, a.Version)
			a.Balance = 80
			require.NoError(t, s.Save(ctx, &a), "a second save of the same value")
			require.EqualValues(t, 2, a.Version)
			require.NoError(t, s.Touch(ctx, &a))
			require.EqualValues(t, 3, a.Version)
			require.Equal(t, a, rowOf(t, db, "a"))

			u, err := s.Update(ctx, "a", func(a *account) error { a.Balance = 70; return nil })
			require.NoError(t, err)
			u.Balance = 60
			require.NoError(t, s.Save(ctx, &u), "Update's result can be saved as it is")
			require.NoError(t, s.Delete(ctx, &u), "and deleted")
			_, err = s.Get(ctx, "a")
			require.ErrorIs(t, err, contend.ErrNotFound)
		})
	}
}

// Version 0 is a version: a stale value read at 0 must not overwrite a row
// that moved to 1.
func TestZeroVersionIsChecked(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db)
	s := accountStore(t, db, accountsConfig)
	ctx := t.Context()

	fresh := account{ID: "a", Balance: 100}
	require.NoError(t, s.Insert(ctx, &fresh))
	require.Zero(t, fresh.Version)
	first, second := fresh, fresh // two requests read version 0
	first.Balance = 10
	require.NoError(t, s.Save(ctx, &first))

	second.Balance = 20
	err := s.Save(ctx, &second)
	require.ErrorIs(t, err, contend.ErrConflict)
	require.Zero(t, second.Version, "a failed save leaves the value as it was")
	require.ErrorIs(t, s.Delete(ctx, &second), contend.ErrConflict)
	require.ErrorIs(t, s.Touch(ctx, &second), contend.ErrConflict)
	require.Equal(t, first, rowOf(t, db, "a"))
}

// Save and Delete of a value read earlier: a stale value conflicts, a gone
// row is not found.
func TestCompareAndSet(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	accounts(t, db, "a")
	s := accountStore(t, db, accountsConfig)
	ctx := t.Context()

	stale, err := s.Get(ctx, "a")
	require.NoError(t, err)
	_, err = s.Update(ctx, "a", func(a *account) error { a.Balance = 1; return nil })
	require.NoError(t, err)

	stale.Balance = 99
	require.ErrorIs(t, s.Save(ctx, &stale), contend.ErrConflict)
	require.ErrorIs(t, s.Delete(ctx, &stale), contend.ErrConflict, "a delete based on a stale read")
	require.EqualValues(t, 1, rowOf(t, db, "a").Balance)

	current, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, s.Delete(ctx, &current))
	for name, err := range map[string]error{
		"save":   s.Save(ctx, &current),
		"touch":  s.Touch(ctx, &current),
		"delete": s.Delete(ctx, &current),
	} {
		require.ErrorIs(t, err, contend.ErrNotFound, name)
		require.NotErrorIs(t, err, contend.ErrConflict, name)
	}
}

// Touch: A decides based on row X without changing it; if B changed X in
// between, A's Touch fails, and with it everything A wrote in the same
// transaction.
func TestTouch(t *testing.T) {
	t.Parallel()
	for _, driver := range testserver.Drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testserver.DB(t, driver)
			accounts(t, db, "x", "y")
			s := accountStore(t, db, accountsConfig)
			ctx := t.Context()

			a, err := s.Get(ctx, "x") // A reads X
			require.NoError(t, err)
			_, err = s.Update(ctx, "x", func(x *account) error { x.Balance = 0; return nil }) // B changes X
			require.NoError(t, err)
			err = s.Touch(ctx, &a)
			require.ErrorIs(t, err, contend.ErrConflict)
			require.EqualValues(t, 0, a.Version)

			// In a transaction: A writes Y based on X, and touches X. B's
			// change to X lands first, so Y's write must roll back too.
			x, err := s.Get(ctx, "x")
			require.NoError(t, err)
			_, err = s.Update(ctx, "x", func(x *account) error { x.Balance = 5; return nil }) // B again
			require.NoError(t, err)
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			txCtx := contend.WithQuerier(ctx, tx)
			_, err = s.Update(txCtx, "y", func(y *account) error { y.Balance += x.Balance; return nil })
			require.NoError(t, err)
			require.ErrorIs(t, s.Touch(txCtx, &x), contend.ErrConflict)
			require.NoError(t, tx.Rollback())
			require.Equal(t, account{ID: "y", Owner: "ann", Balance: 100}, rowOf(t, db, "y"), "Y's write rolled back")

			// Unchallenged, the touch commits with the write and bumps X.
			x, err = s.Get(ctx, "x")
			require.NoError(t, err)
			tx, err = db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			txCtx = contend.WithQuerier(ctx, tx)
			_, err = s.Update(txCtx, "y", func(y *account) error { y.Balance += x.Balance; return nil })
			require.NoError(t, err)
			require.NoError(t, s.Touch(txCtx, &x))
			require.NoError(t, tx.Commit())
			require.EqualValues(t, 105, rowOf(t, db, "y").Balance)
			require.Equal(t, x, rowOf(t, db, "x"))
			require.EqualValues(t, 3, x.Version)
		})
	}
}

// Inside a Guard's fn, the store joins the guard's transaction: a Touch
// conflict there rolls back the guard's writes as well.
func TestStoreJoinsAGuardsTransaction(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "x", "y")
	s := accountStore(t, db, accountsConfig)
	g, err := optimistic.NewGuard(db, accountsConfig)
	require.NoError(t, err)
	ctx := t.Context()

	x, err := s.Get(ctx, "x")
	require.NoError(t, err)
	_, err = s.Update(ctx, "x", func(x *account) error { x.Balance = 0; return nil })
	require.NoError(t, err)
	err = g.Do(ctx, "y", func(ctx context.Context) error {
		if _, err := contend.Querier(ctx, db).ExecContext(ctx, `UPDATE accounts SET balance = 0 WHERE id = 'y'`); err != nil {
			return err
		}
		return s.Touch(ctx, &x)
	})
	require.ErrorIs(t, err, contend.ErrConflict, "fn's Touch conflict is returned")
	require.EqualValues(t, 100, rowOf(t, db, "y").Balance, "and the guard rolled back fn's write")
}

// A panic in fn propagates and writes nothing.
func TestUpdatePanicWritesNothing(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	accounts(t, db, "a")
	s := accountStore(t, db, accountsConfig)
	require.PanicsWithValue(t, "boom", func() {
		_, _ = s.Update(t.Context(), "a", func(a *account) error {
			a.Balance = 0
			panic("boom")
		})
	})
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 100}, rowOf(t, db, "a"))
}

// ctx ending while Update retries stops it at once, even when the policy
// would wait an hour before the next attempt.
func TestUpdateHonoursCtxDuringRetries(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	s := accountStore(t, db, optimistic.Config{
		Table: "accounts",
		Retry: contend.Retry{MaxAttempts: 1000, BaseDelay: time.Hour, MaxDelay: time.Hour},
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	firstRun := make(chan struct{})
	errc := make(chan error, 1)
	runs := 0
	go func() {
		_, err := s.Update(ctx, "a", func(a *account) error {
			if runs++; runs == 1 {
				defer close(firstRun)
			}
			// Move the version under every attempt, so each one loses.
			_, err := db.ExecContext(context.WithoutCancel(ctx), `UPDATE accounts SET version = version + 1 WHERE id = 'a'`)
			return err
		})
		errc <- err
	}()
	// From here Update is writing, or (almost always) waiting up to an hour
	// for its second attempt: either way ctx must end it at once.
	select {
	case <-firstRun:
	case err := <-errc:
		t.Fatalf("Update ended before its first attempt: %v", err)
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, contend.ErrConflict)
		require.Less(t, time.Since(cancelled), 2*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("Update did not return after ctx was cancelled")
	}

	ran := false
	_, err := s.Update(ctx, "a", func(*account) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran, "fn ran under a cancelled ctx")
}

// Field mapping follows sqlx: embedded structs are flattened, `db:"-"` and
// unexported fields are skipped, untagged fields use their lower-cased names,
// and any integer type can hold the version.
func TestMapping(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	_, err := db.Exec(`CREATE TABLE docs (doc_id bigint PRIMARY KEY, title text NOT NULL, body text,
		created_at timestamptz NOT NULL, rev integer NOT NULL)`)
	require.NoError(t, err)
	type meta struct {
		CreatedAt time.Time `db:"created_at"`
	}
	type doc struct {
		meta
		ID      int64   `db:"doc_id"`
		Title   string  // untagged: "title"
		Body    *string `db:"body"`
		Rev     uint32  `db:"rev"`
		Cached  string  `db:"-"`
		scratch int
	}
	s, err := optimistic.NewStore[doc](db, optimistic.Config{Table: "docs", KeyColumn: "doc_id", VersionColumn: "rev"})
	require.NoError(t, err)
	ctx := t.Context()
	created := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	d := doc{meta: meta{CreatedAt: created}, ID: 7, Title: "draft", Cached: "not a column", scratch: 1}
	require.NoError(t, s.Insert(ctx, &d))
	got, err := s.Update(ctx, "7", func(d *doc) error {
		body := "text"
		d.Body, d.Title = &body, "final"
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "final", got.Title)
	require.Equal(t, "text", *got.Body)
	require.EqualValues(t, 1, got.Rev)
	require.True(t, created.Equal(got.CreatedAt))
	require.Empty(t, got.Cached)
	require.NoError(t, s.Touch(ctx, &got))
	require.EqualValues(t, 2, got.Rev)
	var rev int
	require.NoError(t, db.Get(&rev, `SELECT rev FROM docs WHERE doc_id = 7`))
	require.Equal(t, 2, rev)
}

func TestNewStoreRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "postgres")
	accounts(t, db)

	_, err := optimistic.NewStore[int](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "non-struct T")
	_, err = optimistic.NewStore[*account](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "pointer T")
	_, err = optimistic.NewStore[account](nil, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "nil db")

	type noVersion struct {
		ID      string `db:"id"`
		Balance int64  `db:"balance"`
	}
	_, err = optimistic.NewStore[noVersion](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid)
	require.ErrorContains(t, err, "version")
	type noKey struct {
		Balance int64 `db:"balance"`
		Version int64 `db:"version"`
	}
	_, err = optimistic.NewStore[noKey](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid)
	type textVersion struct {
		ID      string `db:"id"`
		Version string `db:"version"`
	}
	_, err = optimistic.NewStore[textVersion](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "a version must be an integer")
	type badTag struct {
		ID      string `db:"id"`
		Version int64  `db:"version"`
		Evil    string `db:"x\" = 1; --"`
	}
	_, err = optimistic.NewStore[badTag](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "a tag that is not an identifier")
	type nested struct {
		ID      string `db:"id"`
		Version int64  `db:"version"`
		Address struct{ City string }
	}
	_, err = optimistic.NewStore[nested](db, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "a struct field no driver can write")

	for name, cfg := range map[string]optimistic.Config{
		"no table":           {},
		"injected table":     {Table: "accounts; DROP TABLE accounts"},
		"bad key column":     {Table: "accounts", KeyColumn: "id or 1=1"},
		"bad version column": {Table: "accounts", VersionColumn: `version" = 0 --`},
		"three-part name":    {Table: "a.b.accounts"},
		"key is version":     {Table: "accounts", KeyColumn: "version"},
	} {
		_, err := optimistic.NewStore[account](db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
		_, err = optimistic.NewGuard(db, cfg)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
	_, err = optimistic.NewGuard(nil, accountsConfig)
	require.ErrorIs(t, err, contend.ErrInvalid, "nil db")

	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM accounts`), "the injection attempts reached nothing")
}

func TestStoreRefusesBadCalls(t *testing.T) {
	t.Parallel()
	db := testserver.DB(t, "pgx")
	accounts(t, db, "a")
	s := accountStore(t, db, accountsConfig)
	ctx := t.Context()

	_, err := s.Get(ctx, "")
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = s.Update(ctx, "", func(*account) error { return nil })
	require.ErrorIs(t, err, contend.ErrInvalid)
	_, err = s.Update(ctx, "a", nil)
	require.ErrorIs(t, err, contend.ErrInvalid, "nil fn")
	for name, op := range map[string]func(context.Context, *account) error{
		"insert": s.Insert, "save": s.Save, "touch": s.Touch, "delete": s.Delete,
	} {
		require.ErrorIs(t, op(ctx, nil), contend.ErrInvalid, name)
		require.ErrorIs(t, op(ctx, &account{}), contend.ErrInvalid, name+" of a value with an empty key")
	}
	require.Equal(t, account{ID: "a", Owner: "ann", Balance: 100}, rowOf(t, db, "a"))

	// A table that does not exist shows at the first call, as the
	// database's error.
	ghost := accountStore(t, db, optimistic.Config{Table: "nosuchtable"})
	_, err = ghost.Get(ctx, "a")
	require.ErrorContains(t, err, "nosuchtable")
}

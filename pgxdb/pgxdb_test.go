package pgxdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/atomic"
	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/optimistic"
	"github.com/contend/contend/pessimistic"
	"github.com/contend/contend/pgxdb"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// setup returns a pgx pool on a schema of the test's own, with one
// product row "p" of stock 10.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testserver.OpenNative(t, testserver.Postgres(t)).Pool
	_, err := pool.Exec(t.Context(), `CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL, version bigint NOT NULL DEFAULT 0);
		INSERT INTO products (id, stock) VALUES ('p', 10)`)
	require.NoError(t, err)
	return pool
}

func stock(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT stock FROM products WHERE id = 'p'`).Scan(&n))
	return n
}

// Handles the strategies cannot classify are refused at construction,
// typed nils included.
func TestWrapRefusesWhatItCannotClassify(t *testing.T) {
	t.Parallel()
	var nilPool *pgxpool.Pool
	var nilConn *pgx.Conn
	for name, db := range map[string]contend.DB{
		"nil":       pgxdb.Wrap(nil),
		"nil pool":  pgxdb.Wrap(nilPool),
		"nil conn":  pgxdb.Wrap(nilConn),
		"unwrapped": setup(t),
	} {
		_, err := pessimistic.NewLocker(db, pessimistic.LockerConfig{Table: "products"})
		require.ErrorIs(t, err, contend.ErrInvalid, name)
		_, err = optimistic.NewGuard(db, optimistic.Config{Table: "products"})
		require.ErrorIs(t, err, contend.ErrInvalid, name)
		_, err = atomic.Update(t.Context(), db, `SELECT 1`)
		require.ErrorIs(t, err, contend.ErrInvalid, name)
	}
}

// fn reaches the guard's pgx.Tx through Querier, and the pool outside a
// guard; its writes commit and roll back with the guard's transaction.
func TestQuerierIsTheGuardsTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := t.Context()
	require.Same(t, pool, pgxdb.Querier(ctx, pool).(*pgxpool.Pool))

	l, err := pessimistic.NewLocker(pgxdb.Wrap(pool), pessimistic.LockerConfig{Table: "products"})
	require.NoError(t, err)
	err = l.Do(ctx, "p", func(ctx context.Context) error {
		require.Nil(t, contend.Querier(ctx, nil), "a pgx guard has no database/sql transaction to give")
		q := pgxdb.Querier(ctx, pool)
		_, isTx := q.(pgx.Tx)
		require.True(t, isTx, "fn gets the guard's pgx.Tx, not the pool: %T", q)
		_, err := q.Exec(ctx, `UPDATE products SET stock = stock - 1 WHERE id = 'p'`)
		require.NoError(t, err)
		return context.Canceled // rolls back
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 10, stock(t, pool))

	require.NoError(t, pessimistic.InTx(ctx, pgxdb.Wrap(pool), nil, func(ctx context.Context) error {
		applied, err := atomic.Update(ctx, pgxdb.Wrap(pgxdb.Querier(ctx, pool)),
			`UPDATE products SET stock = stock - 1 WHERE id = 'p' AND stock > 0`)
		require.True(t, applied)
		return err
	}))
	require.Equal(t, 9, stock(t, pool))
}

// A pgx.Tx of the caller's is joined as a *sql.Tx is: the guard runs in
// it, commits nothing, and nested guards on the pool join it too.
func TestCallersTransactionIsJoined(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))

	inTx, err := pessimistic.NewLocker(pgxdb.Wrap(tx), pessimistic.LockerConfig{Table: "products"})
	require.NoError(t, err)
	onPool, err := optimistic.NewGuard(pgxdb.Wrap(pool), optimistic.Config{Table: "products"})
	require.NoError(t, err)
	require.NoError(t, inTx.Do(ctx, "p", func(ctx context.Context) error {
		require.Same(t, tx, pgxdb.Querier(ctx, pool), "fn gets the caller's transaction")
		// On the pool, a nested guard joins it: on a connection of its own
		// it would wait for the row lock this goroutine holds.
		return onPool.Do(ctx, "p", func(ctx context.Context) error {
			_, err := pgxdb.Querier(ctx, pool).Exec(ctx, `UPDATE products SET stock = stock - 2 WHERE id = 'p'`)
			return err
		})
	}))
	require.Equal(t, 10, stock(t, pool), "nothing commits before the caller does")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 8, stock(t, pool))
}

// Guards on different drivers cannot share a transaction: nesting one in
// the other's fn is refused, not left to wait for the outer one's lock.
func TestGuardsOfTwoDriversDoNotNest(t *testing.T) {
	t.Parallel()
	url := testserver.Postgres(t)
	native := testserver.OpenNative(t, url)
	std := testserver.Open(t, "pgx", url)
	_, err := std.Exec(`CREATE TABLE products (id text PRIMARY KEY, stock int NOT NULL); INSERT INTO products VALUES ('p', 1)`)
	require.NoError(t, err)
	ctx := t.Context()
	ofPgx, err := pessimistic.NewLocker(native, pessimistic.LockerConfig{Table: "products"})
	require.NoError(t, err)
	ofStd, err := pessimistic.NewLocker(std, pessimistic.LockerConfig{Table: "products"})
	require.NoError(t, err)

	ran := false
	require.NoError(t, ofPgx.Do(ctx, "p", func(ctx context.Context) error {
		err := ofStd.Do(ctx, "p", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, contend.ErrInvalid)
		return nil
	}))
	require.NoError(t, ofStd.Do(ctx, "p", func(ctx context.Context) error {
		err := ofPgx.Do(ctx, "p", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, contend.ErrInvalid)
		return nil
	}))
	require.False(t, ran)
}

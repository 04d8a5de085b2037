package atomic

import (
	"context"
	"errors"
	"fmt"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/txn"
)

// Update runs one conditional statement and reports whether it applied: whether
// it affected exactly one row. The condition belongs in the statement itself,
// so that the check and the write are one atomic step on the server:
//
//	applied, err := atomic.Update(ctx, db,
//		`UPDATE products SET stock = stock - $2 WHERE id = $1 AND stock >= $2`, id, n)
//
// applied == false with a nil error is the lost race ("sold out", "already
// running"), not a failure. db is a pool, a connection or a transaction: of
// database/sql or sqlx (anything with ExecContext), or of pgx wrapped by
// pgxdb.Wrap. Inside a guard's fn, pass [contend.Querier](ctx, db) (or
// pgxdb.Querier) to run in the guard's transaction.
func Update(ctx context.Context, db contend.DB, query string, args ...any) (applied bool, err error) {
	return UpdateN(ctx, db, 1, query, args...)
}

// UpdateN is [Update] for a statement that must affect exactly n rows, such as
// "reserve these n seats". When it affects another number of rows it has still
// run: call it inside a transaction and roll back when applied is false.
func UpdateN(ctx context.Context, db contend.DB, n int64, query string, args ...any) (applied bool, err error) {
	q, err := sqldb.Statements(db)
	if err != nil {
		return false, fmt.Errorf("atomic: %w", err)
	}
	got, err := exec(ctx, q, query, args)
	if err != nil {
		return false, err
	}
	return got == n, nil
}

// exec runs the statement, watched (txn.WatchExec).
func exec(ctx context.Context, q sqldb.Querier, query string, args []any) (int64, error) {
	return txn.WatchExec(ctx, q, query, args)
}

// UpdateReturning runs one conditional statement with a RETURNING clause and
// scans the affected row's returned columns into dest. It reports applied ==
// false, and leaves dest untouched, when no row was affected:
//
//	var left int
//	applied, err := atomic.UpdateReturning(ctx, db, []any{&left},
//		`UPDATE products SET stock = stock - 1 WHERE id = $1 AND stock > 0 RETURNING stock`, id)
//
// The statement must affect at most one row; with more, the first returned row
// is scanned and the others are discarded. MySQL and MariaDB have no UPDATE
// ... RETURNING: use [UpdateSelect] there.
func UpdateReturning(ctx context.Context, db contend.DB, dest []any, query string, args ...any) (applied bool, err error) {
	q, err := sqldb.Statements(db)
	if err != nil {
		return false, fmt.Errorf("atomic: %w", err)
	}
	err = scan(ctx, q, dest, query, args)
	if sqldb.NoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// UpdateSelect is [UpdateReturning] in the shape every dialect has, for
// MySQL and MariaDB, whose UPDATE has no RETURNING: it runs update, a
// conditional statement, and when it affected exactly one row runs query in
// the same transaction and scans query's first row into dest:
//
//	var left int
//	applied, err := atomic.UpdateSelect(ctx, db, []any{&left},
//		"UPDATE products SET stock = stock - 1 WHERE id = ? AND stock > 0", []any{id},
//		"SELECT stock FROM products WHERE id = ?", id)
//
// The update's row lock lasts until the transaction ends, so query, reading
// the updated row, sees it as the update left it (in MySQL's REPEATABLE READ
// too: a transaction reads its own writes), and of concurrent calls the
// update's condition lets exactly as many win as it would alone. When the
// update affects another number of rows, applied is false and dest
// untouched. db is a pool (not a single connection, which is refused: one
// session cannot be shared by two callers' transactions), on which a
// transaction is begun, rolled back
// when the update did not apply, and run again on a deadlock; or a
// transaction, the caller's or the one ctx carries (a guard's fn), which is
// joined and never ended: roll it back when the update may have touched
// other rows than the one it was meant for.
func UpdateSelect(ctx context.Context, db contend.DB, dest []any, update string, updateArgs []any, query string, queryArgs ...any) (applied bool, err error) {
	d, err := sqldb.Open(db)
	if err != nil {
		return false, fmt.Errorf("atomic: %w", err)
	}
	_, err = txn.RunTx(ctx, d, txn.Options{}, func(ctx context.Context, tx sqldb.Tx) error {
		n, err := exec(ctx, tx, update, updateArgs)
		if err != nil {
			return err
		}
		if n != 1 {
			return errNotApplied
		}
		if err := scan(ctx, tx, dest, query, queryArgs); err != nil {
			if sqldb.NoRows(err) {
				return fmt.Errorf("atomic: the query after the update found no row: %w", err)
			}
			return err
		}
		applied = true
		return nil
	})
	if errors.Is(err, errNotApplied) {
		return false, nil
	}
	return applied && err == nil, err
}

// scan runs query and scans its first row into dest, watched
// (txn.WatchScan): nothing writes into the caller's variables after the
// call returned.
func scan(ctx context.Context, q sqldb.Querier, dest []any, query string, args []any) error {
	return txn.WatchScan(ctx, q, query, args, dest)
}

// errNotApplied rolls back an UpdateSelect whose update did not apply.
var errNotApplied = errors.New("atomic: not applied")

package atomic

import (
	"context"
	"errors"
	"fmt"

	"github.com/contend/contend/internal/sqldb"
)

// mysqlPlan is postgresPlan on MySQL and MariaDB, whose statements
// differ from PostgreSQL's in three ways. Placeholders bind in the order
// they appear, so each statement takes the claimer's arguments (key, token,
// lease µs) through an order of its own. There is no UPDATE ... RETURNING
// to tell a win, a lost race and a missing row apart in one round trip, so
// the claims of a hot key share a read rather than the claim (below); as on
// PostgreSQL, any other claim that matched no row asks whether the row
// exists, in a statement of its own.
// And the lease is a DATETIME(6) in UTC, against UTC_TIMESTAMP(6): the
// server's clock, whatever each session's time_zone, read as each statement
// begins (not as its transaction did, unlike PostgreSQL's now()).
//
// A plain UPDATE is enough under InnoDB's default REPEATABLE READ too: an
// UPDATE reads the latest committed row, not the transaction's snapshot,
// after waiting for the row lock of a concurrent claim, so the second of two
// claims finds the owner set and matches nothing. The driver must report
// rows matched (clientFoundRows), which mysqldb.Wrap checks.
func mysqlPlan(table, key, owner, lease string) plan {
	var (
		free       = owner + " IS NULL"
		claimSQL   = fmt.Sprintf("UPDATE %s SET %s = ? WHERE %s = ? AND %s", table, owner, key, free)
		claimOrder = []int{argToken, argKey}
		releaseSQL = fmt.Sprintf("UPDATE %s SET %s = NULL WHERE %s = ? AND %s = ?", table, owner, key, owner)
		extendSQL  string
	)
	if lease != "" {
		deadline := "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
		free = fmt.Sprintf("(%s IS NULL OR %s < UTC_TIMESTAMP(6))", owner, lease)
		claimSQL = fmt.Sprintf("UPDATE %s SET %s = ?, %s = %s WHERE %s = ? AND %s", table, owner, lease, deadline, key, free)
		claimOrder = []int{argToken, argLease, argKey}
		releaseSQL = fmt.Sprintf("UPDATE %s SET %s = NULL, %s = NULL WHERE %s = ? AND %s = ?", table, owner, lease, key, owner)
		// As on PostgreSQL, an expired claim is not revived.
		extendSQL = fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s = ? AND %s = ? AND %s >= UTC_TIMESTAMP(6)",
			table, lease, deadline, key, owner, lease)
	}
	existsSQL := fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s = ?)", table, key)
	// In a transaction, a plain SELECT reads the transaction's snapshot under
	// REPEATABLE READ (InnoDB's default), which still has a row deleted
	// since: a locking read reads the latest committed row, as the UPDATE
	// did. Its shared lock (a gap lock when the row is gone) lasts until the
	// transaction ends; outside one, a plain SELECT sees the latest row
	// already, and waits for no lock.
	lockedExistsSQL := fmt.Sprintf("SELECT COUNT(*) > 0 FROM %s WHERE %s = ? LOCK IN SHARE MODE", table, key)
	// The claims of a hot key share a read here, not the claim itself (as
	// on PostgreSQL): every UPDATE locks the row it reads, a loser's too, in
	// turn. Outside a transaction, the only place it runs, the read is a
	// consistent read of the latest committed row: it takes no lock and
	// waits for none. It answers in a value (readHeld, readFree or
	// readMissing): an aggregate has its one row whether the key's is there
	// or not, and an integer, not SUM's decimal, scans without a parse.
	readSQL := fmt.Sprintf("SELECT CAST(2 * (COUNT(*) = 0) + COALESCE(SUM((%s) IS TRUE), 0) AS SIGNED) FROM %s WHERE %s = ?",
		free, table, key)
	// The release takes key, token: the order the claimer passes them in.
	return plan{claim: claimSQL, exists: existsSQL, lockedExists: lockedExistsSQL, hot: readSQL,
		release: releaseSQL, extend: extendSQL,
		claimOrder: claimOrder, extendOrder: []int{argLease, argKey, argToken}, won: 1, unsure: 0}
}

// The positions of the claimer's arguments, as claimRow, releaseRow and
// extendRow pass them.
const (
	argKey = iota
	argToken
	argLease
)

// inOrder returns s taking the claimer's arguments in order, or s itself
// when order is nil.
func inOrder(s sqldb.Stmt, order []int) sqldb.Stmt {
	if order == nil {
		return s
	}
	return ordered{s, order}
}

// ordered is a statement whose placeholders take the claimer's arguments
// in order.
type ordered struct {
	sqldb.Stmt
	order []int
}

func (s ordered) args(args []any) []any {
	out := make([]any, len(s.order))
	for i, j := range s.order {
		out[i] = args[j]
	}
	return out
}

func (s ordered) Exec(ctx context.Context, tx sqldb.Tx, args ...any) (int64, error) {
	return s.Stmt.Exec(ctx, tx, s.args(args)...)
}

func (s ordered) QueryRow(ctx context.Context, tx sqldb.Tx, args ...any) sqldb.Row {
	return s.Stmt.QueryRow(ctx, tx, s.args(args)...)
}

// probedClaim answers a claim in its count (0: claimed, 1: held, 2: no
// row): claim's own count tells a win (won) and, for PostgreSQL's claim
// of a hot key, a row held (any other count); exists asks whether the row is there when claim
// cannot tell (unsure), in a statement of its own, which sees a row deleted
// while the claim waited for its lock. On MySQL, a claim in a transaction
// (the one ctx carries, or the claimer's own: onTx) asks lockedExists
// instead, which reads past the transaction's snapshot.
type probedClaim struct {
	claim        sqldb.Stmt
	exists       sqldb.Stmt // takes the key, the first of the claimer's arguments
	lockedExists sqldb.Stmt // nil on PostgreSQL, whose claim fails rather than read a stale snapshot
	onTx         bool
	won, unsure  int64 // claim's counts
	// borrowsExists: exists is another probedClaim's, which closes it.
	borrowsExists bool
}

func (s probedClaim) Exec(ctx context.Context, tx sqldb.Tx, args ...any) (int64, error) {
	n, err := s.claim.Exec(ctx, tx, args...)
	switch {
	case err != nil:
		return 0, err
	case n == s.won:
		return 0, nil
	case n != s.unsure:
		return 1, nil
	}
	probe := s.exists
	if s.lockedExists != nil && (tx != nil || s.onTx) {
		probe = s.lockedExists
	}
	var exists bool
	if err := probe.QueryRow(ctx, tx, args[argKey:argKey+1]...).Scan(&exists); err != nil {
		return 0, err
	}
	if exists {
		return 1, nil
	}
	return 2, nil
}

func (s probedClaim) QueryRow(context.Context, sqldb.Tx, ...any) sqldb.Row {
	return errRow{errors.New("atomic: a claim answers in its count: run it with Exec")}
}

func (s probedClaim) Close() error {
	err := s.claim.Close()
	if !s.borrowsExists {
		err = errors.Join(err, s.exists.Close())
	}
	if s.lockedExists != nil {
		err = errors.Join(err, s.lockedExists.Close())
	}
	return err
}

// scannedCount is a statement whose one row holds the count it answers
// in, for a driver that counts no rows of a SELECT.
type scannedCount struct{ sqldb.Stmt }

func (s scannedCount) Exec(ctx context.Context, tx sqldb.Tx, args ...any) (int64, error) {
	var n int64
	err := s.Stmt.QueryRow(ctx, tx, args...).Scan(&n)
	return n, err
}

// closeAll closes the statements of stmts that were prepared.
func closeAll(stmts ...sqldb.Stmt) {
	for _, s := range stmts {
		if s != nil {
			_ = s.Close()
		}
	}
}

// errRow is a Row whose Scan reports err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

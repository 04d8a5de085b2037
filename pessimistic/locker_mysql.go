package pessimistic

import (
	"fmt"
	"strings"

	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
)

// newMySQLLocker is NewLocker on MySQL and MariaDB (10.6 or later, for SKIP
// LOCKED).
//
// InnoDB's default isolation, REPEATABLE READ, reads from a snapshot taken
// at the transaction's first plain read, so a read-check-write that is safe
// under a row lock in PostgreSQL's READ COMMITTED could read a row as it was
// before the lock was had: when the transaction read anything before (a
// lock nested in another guard's fn, which joins its transaction), fn's
// plain SELECT of the locked row would see the snapshot, not the last
// commit, and write back a lost update. The locker therefore begins its
// transactions at READ COMMITTED unless LockerConfig.Isolation says otherwise
// (newRunner, through sqldb's GuardTx): each plain read sees the latest
// commit, and the row lock keeps that commit the latest until the
// transaction ends.
//
// There is no FOR NO KEY UPDATE: both strengths lock FOR UPDATE. The lock
// timeout is innodb_lock_wait_timeout, set around the lock statement and put
// back after it (runner.lockMySQL).
func newMySQLLocker(r runner, cfg LockerConfig) (*Locker, error) {
	table, err := sqlident.QuoteIn(sqldb.MySQL, "pessimistic: table", cfg.Table)
	if err != nil {
		return nil, err
	}
	key, err := sqlident.QuoteIn(sqldb.MySQL, "pessimistic: key column", cfg.KeyColumn)
	if err != nil {
		return nil, err
	}
	lockClause, where := clauses("FOR UPDATE", cfg)
	return &Locker{
		r:         r,
		table:     cfg.Table,
		lockOne:   fmt.Sprintf("SELECT 1 FROM %s WHERE %s = ? %s", table, key, lockClause),
		existsOne: fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s = ?)", table, key),
		// As on PostgreSQL, the rows are locked in key order, so callers
		// locking overlapping sets take the shared rows in one order. The
		// list takes one placeholder per key: only the count of keys
		// reaches the statement's text.
		many: func(keys []string) (lock, exists string, args []any) {
			in := strings.TrimSuffix(strings.Repeat("?, ", len(keys)), ", ")
			args = make([]any, len(keys))
			for i, k := range keys {
				args[i] = k
			}
			return fmt.Sprintf("SELECT %s FROM %s WHERE %s IN (%s) ORDER BY %s %s", key, table, key, in, key, lockClause),
				fmt.Sprintf("SELECT count(*) FROM %s WHERE %s IN (%s)", table, key, in), args
		},
		claim: fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT ? FOR UPDATE SKIP LOCKED", key, table, where, key),
	}, nil
}

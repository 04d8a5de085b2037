package guardtest

import (
	"github.com/contend/contend/internal/sqldb"
)

// counterSQL is the suite's own statements on the counter table, in a
// dialect's words. Each takes key first and the value second; on MySQL,
// whose placeholders bind in the order they appear, set binds them through
// setArgs.
type counterSQL struct {
	create, insert, get, set string
	// setArgs orders set's arguments.
	setArgs func(key string, n int64) []any
}

func counterStatements(d sqldb.Dialect) counterSQL {
	if d == sqldb.MySQL {
		// key is a reserved word in MySQL, and a text column cannot be a
		// key without a length.
		return counterSQL{
			create:  "CREATE TABLE " + counterTable + " (`key` varchar(191) PRIMARY KEY, n bigint NOT NULL)",
			insert:  "INSERT INTO " + counterTable + " (`key`, n) VALUES (?, 0)",
			get:     "SELECT n FROM " + counterTable + " WHERE `key` = ?",
			set:     "UPDATE " + counterTable + " SET n = ? WHERE `key` = ?",
			setArgs: func(key string, n int64) []any { return []any{n, key} },
		}
	}
	return counterSQL{
		create:  `CREATE TABLE ` + counterTable + ` (key text PRIMARY KEY, n bigint NOT NULL)`,
		insert:  `INSERT INTO ` + counterTable + ` (key, n) VALUES ($1, 0)`,
		get:     `SELECT n FROM ` + counterTable + ` WHERE key = $1`,
		set:     `UPDATE ` + counterTable + ` SET n = $2 WHERE key = $1`,
		setArgs: func(key string, n int64) []any { return []any{key, n} },
	}
}

package sqldb

import (
	"database/sql"
	"fmt"
	"reflect"
	"strconv"

	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
)

// Dialect is the SQL a handle's server speaks, fixed when the handle is
// classified: by the driver package that wrapped it (package mysqldb for
// MySQL), or PostgreSQL for a bare database/sql handle and for pgx.
type Dialect int

const (
	// Postgres is PostgreSQL: $n placeholders, double-quoted identifiers.
	Postgres Dialect = iota
	// MySQL is MySQL 8 and MariaDB: ? placeholders, which bind in the order
	// they appear, and backquoted identifiers.
	MySQL
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Param returns the placeholder of a statement's nth parameter, from 1:
// $n on PostgreSQL, ? on MySQL. MySQL binds its placeholders in the order
// they appear, so a statement built for both dialects must number its
// parameters in that order and take its arguments so.
func (d Dialect) Param(n int) string {
	if d == MySQL {
		return "?"
	}
	return "$" + strconv.Itoa(n)
}

// GuardTx returns the options of the transactions a guard begins, at
// isolation (sql.LevelDefault for the default) on d's server: nil, the
// server's own default, on PostgreSQL; READ COMMITTED by default on MySQL.
// InnoDB's default, REPEATABLE READ, reads from a snapshot taken at a
// transaction's first plain read, so a row lock had after that read (a
// lock nested in another guard's fn, which joins its transaction) would
// not make fn's plain reads see the row's latest commit, and a
// read-check-write under the lock would write back a lost update.
func (d Dialect) GuardTx(isolation sql.IsolationLevel) *sql.TxOptions {
	if isolation == sql.LevelDefault && d == MySQL {
		isolation = sql.LevelReadCommitted
	}
	if isolation == sql.LevelDefault {
		return nil
	}
	return &sql.TxOptions{Isolation: isolation}
}

// OpenStd classifies a database/sql handle of a driver whose server speaks
// dialect, as [Open] does a bare one: the driver packages (mysqldb) use it
// to give their handles the code path every database/sql handle shares.
func OpenStd(db contend.DBTX, dialect Dialect) (DB, error) {
	if IsNil(db) {
		return nil, fmt.Errorf("nil db: %w", contend.ErrInvalid)
	}
	d, err := classifyStd(db)
	if err != nil {
		return nil, err
	}
	d = d.withDialect(dialect)
	if mysql, _ := DriverIsMySQL(db); mysql && d.tx == nil {
		// go-sql-driver/mysql closes the connection when a statement's ctx
		// ends, so its statements need no watching; its COMMIT, sent with
		// no ctx, still does.
		d.ends = true
	}
	return d, nil
}

// mysqlDriverPkg is the package of go-sql-driver/mysql, named here without
// importing it, so that a handle of that driver passed bare is told to be
// wrapped rather than run as PostgreSQL.
const mysqlDriverPkg = "github.com/go-sql-driver/mysql"

// DriverIsMySQL reports whether db, a pool or a connection, is of
// go-sql-driver/mysql; known is false for a handle that does not say its
// driver (a *sql.Tx, or a wrapper of the caller's).
func DriverIsMySQL(db contend.DBTX) (mysql, known bool) {
	var drv any
	switch h := db.(type) {
	case *sql.DB:
		drv = h.Driver()
	case *sqlx.DB:
		drv = h.Driver()
	case *sql.Conn:
		// Raw takes the connection's lock only: no round trip.
		_ = h.Raw(func(c any) error { drv = c; return nil })
	default:
		return false, false
	}
	t := reflect.TypeOf(drv)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t != nil && t.PkgPath() == mysqlDriverPkg, true
}

// refuseBareMySQL returns an error matching [contend.ErrInvalid] when db
// is a pool or a connection of go-sql-driver/mysql: run as PostgreSQL its
// statements would not parse, and its affected-row counts may count rows
// changed rather than matched. A *sql.Tx does not say its driver; a bare
// one of MySQL fails at its first statement instead.
func refuseBareMySQL(db contend.DBTX) error {
	if mysql, _ := DriverIsMySQL(db); !mysql {
		return nil
	}
	return fmt.Errorf("db is a %T of go-sql-driver/mysql: wrap it once with mysqldb.Wrap, which states the dialect "+
		"and checks the DSN has clientFoundRows=true: %w", db, contend.ErrInvalid)
}

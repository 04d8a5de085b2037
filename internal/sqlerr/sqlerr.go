// Package sqlerr classifies database errors, once, for every driver the
// library supports, importing none of them: lib/pq's *pq.Error and pgx's
// *pgconn.PgError both report a SQLSTATE through a SQLState method, and
// go-sql-driver/mysql's *mysql.MySQLError, which has none, is read by its
// error number and given the SQLSTATE of the PostgreSQL error the
// strategies treat the same way.
package sqlerr

import (
	"errors"
	"reflect"
)

// SQLSTATE codes the strategies act on.
const (
	UniqueViolation      = "23505"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	LockNotAvailable     = "55P03" // NOWAIT, and lock_timeout running out
	QueryCanceled        = "57014" // a client cancel, and statement_timeout
)

// MySQL and MariaDB error numbers the strategies act on, and the code
// [Code] gives each.
const (
	MySQLDupEntry         = 1062 // UniqueViolation
	MySQLLockWaitTimeout  = 1205 // LockNotAvailable: innodb_lock_wait_timeout, and MariaDB's NOWAIT and WAIT n
	MySQLDeadlock         = 1213 // DeadlockDetected
	MySQLQueryInterrupted = 1317 // QueryCanceled: KILL QUERY
	MySQLStatementTimeout = 1969 // QueryCanceled: MariaDB's max_statement_time
	MySQLRecordChanged    = 1020 // SerializationFailure: MariaDB's innodb_snapshot_isolation
	MySQLQueryTimeout     = 3024 // QueryCanceled: MySQL's max_execution_time
	MySQLLockNowait       = 3572 // LockNotAvailable: MySQL 8's NOWAIT
)

var mysqlCodes = map[uint16]string{
	MySQLDupEntry:         UniqueViolation,
	MySQLLockWaitTimeout:  LockNotAvailable,
	MySQLDeadlock:         DeadlockDetected,
	MySQLQueryInterrupted: QueryCanceled,
	MySQLStatementTimeout: QueryCanceled,
	MySQLRecordChanged:    SerializationFailure,
	MySQLQueryTimeout:     QueryCanceled,
	MySQLLockNowait:       LockNotAvailable,
}

// Code returns the SQLSTATE of the first error in err's chain that has one,
// or "" when none does. A MySQL error's code is the PostgreSQL SQLSTATE of
// the same condition (a MySQL deadlock is [DeadlockDetected], a NOWAIT
// failure [LockNotAvailable]), or "" for a number the strategies do not act
// on.
func Code(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	if n, ok := MySQLNumber(err); ok {
		return mysqlCodes[n]
	}
	return ""
}

// mysqlError is the package path and name of go-sql-driver/mysql's error
// type, matched by reflection so that no program links the driver through
// this package.
const (
	mysqlPkg       = "github.com/go-sql-driver/mysql"
	mysqlErrorName = "MySQLError"
)

// MySQLNumber returns the error number of the first *mysql.MySQLError in
// err's chain.
func MySQLNumber(err error) (uint16, bool) {
	for err != nil {
		v := reflect.ValueOf(err)
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			if e := v.Elem(); e.Kind() == reflect.Struct && e.Type().PkgPath() == mysqlPkg && e.Type().Name() == mysqlErrorName {
				if f := e.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
					return uint16(f.Uint()), true
				}
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if n, ok := MySQLNumber(e); ok {
					return n, true
				}
			}
			return 0, false
		default:
			return 0, false
		}
	}
	return 0, false
}

// Is reports whether err carries one of codes.
func Is(err error, codes ...string) bool {
	c := Code(err)
	if c == "" {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// Retryable reports whether the whole transaction that failed with err may
// succeed when run again from the start: a deadlock victim or a serialization
// failure. Nothing the transaction did survives; it must be rolled back first.
func Retryable(err error) bool { return Is(err, DeadlockDetected, SerializationFailure) }

// FromServer reports whether err is an error the server answered with:
// the statement reached it and failed, so in autocommit none of its
// effects stay. Any other error of a statement sent (a context that ended,
// a connection that broke) leaves unknown whether the server applied it.
func FromServer(err error) bool {
	if _, ok := MySQLNumber(err); ok {
		return true
	}
	var s interface{ SQLState() string }
	return errors.As(err, &s)
}

package testserver

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/mysqldb"
)

// MariaDBEnv points discovery at a MariaDB (or MySQL) server other than the
// local one, as a URL: mysql://user:password@host:port/database.
const MariaDBEnv = "CONTEND_MARIADB_URL"

// DefaultMariaDBURL is where discovery looks when [MariaDBEnv] is unset.
const DefaultMariaDBURL = "mysql://root@127.0.0.1:3306/test"

// MariaDBDriver names MariaDB through go-sql-driver/mysql, a pool wrapped by
// mysqldb.Wrap, among the drivers SQL tests run against. Its URLs are
// mysql:// URLs, which [Open] turns into the driver's DSN.
const MariaDBDriver = "mariadb"

// MariaDBURL returns the URL of the MariaDB server to use. No throwaway
// server is started: when nothing answers, the error says how to start the
// local one.
func MariaDBURL() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if mariaURL != "" {
		return mariaURL, nil
	}
	u, err := discover(MariaDBEnv, DefaultMariaDBURL, func() (string, func() error, error) {
		return "", nil, fmt.Errorf("no throwaway MariaDB is started by the tests")
	})
	if err != nil {
		return "", fmt.Errorf("testserver: no MariaDB: %w\n"+
			"Start the local one (start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd),\n"+
			"or set %s to a server's URL (e.g. %s)", err, MariaDBEnv, DefaultMariaDBURL)
	}
	mariaURL = u
	return u, nil
}

// MariaDBConfig returns the driver's config for a mysql:// URL, with
// clientFoundRows and parseTime set unless the URL says otherwise.
func MariaDBConfig(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	for _, p := range []string{"clientFoundRows", "parseTime"} {
		if q.Get(p) == "" {
			q.Set(p, "true")
		}
	}
	password, _ := u.User.Password()
	cfg, err := mysql.ParseDSN(fmt.Sprintf("tcp(%s)%s?%s", u.Host, u.Path, q.Encode()))
	if err != nil {
		return nil, err
	}
	cfg.User, cfg.Passwd = u.User.Username(), password
	return cfg, nil
}

// openMariaDB opens a pool of the driver on a mysql:// URL.
func openMariaDB(rawURL string) (*sql.DB, error) {
	cfg, err := MariaDBConfig(rawURL)
	if err != nil {
		return nil, err
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// CreateDatabase creates a fresh database on the MariaDB server at
// serverURL and returns its name and a URL whose connections use it.
func CreateDatabase(ctx context.Context, serverURL string) (name, dbURL string, err error) {
	name = RandomName("contend_")
	db, err := openMariaDB(serverURL)
	if err != nil {
		return "", "", err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", "", fmt.Errorf("testserver: create database: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", "", err
	}
	u.Path = "/" + name
	return name, u.String(), nil
}

// DropDatabase drops a database made by [CreateDatabase].
func DropDatabase(ctx context.Context, serverURL, name string) error {
	db, err := openMariaDB(serverURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
	return err
}

// killSessions ends the MariaDB sessions that use database name; its errors
// are of no interest, the drop that follows reports what stays.
func killSessions(ctx context.Context, serverURL, name string) {
	db, err := openMariaDB(serverURL)
	if err != nil {
		return
	}
	defer db.Close()
	var ids []int64
	rows, err := db.QueryContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()`, name)
	if err != nil {
		return
	}
	for rows.Next() {
		var id int64
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	for _, id := range ids {
		_, _ = db.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
	}
}

// MariaDB creates a database of t's own on the MariaDB server and returns a
// mysql:// URL whose connections use it; the database is dropped when t
// ends. It fails t when no server answers.
func MariaDB(t testing.TB) string {
	t.Helper()
	server, err := MariaDBURL()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name, u, err := CreateDatabase(ctx, server)
	if err != nil {
		t.Fatalf("%v (server %s)", err, server)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(ctx, dropTimeout)
		defer cancel()
		if t.Failed() {
			// As for a PostgreSQL schema: a call left behind may hold a lock.
			killSessions(ctx, server, name)
		}
		if err := DropDatabase(ctx, server, name); err != nil {
			t.Errorf("testserver: drop database %s: %v (a session of the test still holds a lock in it: a call was left behind)", name, err)
		}
	})
	return u
}

// URL returns a URL of an isolated database for t on driver's server: a
// schema of PostgreSQL's, or a MariaDB database under [MariaDBDriver].
func URL(t testing.TB, driver string) string {
	t.Helper()
	if driver == MariaDBDriver {
		return MariaDB(t)
	}
	return Postgres(t)
}

// Dialect returns the dialect of driver's server.
func Dialect(driver string) sqldb.Dialect {
	if driver == MariaDBDriver {
		return sqldb.MySQL
	}
	return sqldb.Postgres
}

// MariaDBHandle is a pool wrapped by mysqldb.Wrap that still knows its
// pool, for [Querier].
type MariaDBHandle struct {
	sqldb.Wrapped
	DB *sqlx.DB
}

func openMariaDBHandle(t testing.TB, rawURL string) MariaDBHandle {
	t.Helper()
	db := Open(t, MariaDBDriver, rawURL)
	return MariaDBHandle{mysqldb.Wrap(db).(sqldb.Wrapped), db}
}

// mariaDBQuerier is [Querier] for a handle on MariaDB.
func mariaDBQuerier(ctx context.Context, h MariaDBHandle) sqldb.Querier {
	d, err := sqldb.OpenStd(contend.Querier(ctx, h.DB), sqldb.MySQL)
	if err != nil {
		panic(fmt.Sprintf("testserver: Querier: %v", err))
	}
	return d
}

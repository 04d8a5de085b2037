// Package testserver finds the PostgreSQL and Redis servers that tests,
// examples and benchmarks run against, and hands each test an isolated
// PostgreSQL schema and Redis key prefix on them.
//
// Discovery, in order: CONTEND_POSTGRES_URL / CONTEND_REDIS_URL when set; else
// the local servers on their standard ports (127.0.0.1:5432, database test,
// user postgres; 127.0.0.1:6379); else a throwaway server started from the
// locally installed binaries (initdb and postgres, redis-server) in a temporary
// directory on a free port, stopped by [StopAll]. When the binaries are missing
// too, discovery fails with a message that names the packages to install and
// the variables to set. Nothing here skips a test.
package testserver

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	// The two PostgreSQL drivers the library supports: "postgres" and "pgx".
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
)

// Environment variables that point discovery at existing servers.
const (
	PostgresEnv = "CONTEND_POSTGRES_URL"
	RedisEnv    = "CONTEND_REDIS_URL"
)

// Where discovery looks when the variables are unset.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// Drivers lists the database/sql driver names of the PostgreSQL drivers the
// library supports; tests run against each.
var Drivers = []string{"postgres", "pgx"}

var (
	mu       sync.Mutex // protects the fields below
	pgURL    string
	redisURL string
	mariaURL string
	stops    []func() error
	exported []string // variables set to point worker processes at started servers
)

// PostgresURL returns the URL of the PostgreSQL server to use, starting a
// throwaway one when needed (see the package doc).
func PostgresURL() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if pgURL != "" {
		return pgURL, nil
	}
	u, err := discover(PostgresEnv, DefaultPostgresURL, startPostgres)
	if err != nil {
		return "", fmt.Errorf("testserver: no PostgreSQL: %w\n"+
			"Install PostgreSQL (Debian: apt-get install postgresql) so a throwaway server can be started,\n"+
			"start the local one (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start),\n"+
			"or set %s to a server's URL (e.g. %s)", err, PostgresEnv, DefaultPostgresURL)
	}
	pgURL = u
	return u, nil
}

// RedisURL returns the URL of the Redis server to use, starting a throwaway one
// when needed (see the package doc).
func RedisURL() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if redisURL != "" {
		return redisURL, nil
	}
	u, err := discover(RedisEnv, DefaultRedisURL, startRedis)
	if err != nil {
		return "", fmt.Errorf("testserver: no Redis: %w\n"+
			"Install Redis (Debian: apt-get install redis-server) so a throwaway server can be started,\n"+
			"start the local one (redis-server --daemonize yes --port 6379 --save \"\" --appendonly no),\n"+
			"or set %s to a server's URL (e.g. %s)", err, RedisEnv, DefaultRedisURL)
	}
	redisURL = u
	return u, nil
}

// discover returns the URL in env, else def when its port answers, else the
// URL of a server that start starts. Callers hold mu.
func discover(env, def string, start func() (string, func() error, error)) (string, error) {
	if u := os.Getenv(env); u != "" {
		return u, nil
	}
	u, err := url.Parse(def)
	if err != nil {
		return "", err
	}
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		return def, nil
	}
	started, stop, err := start()
	if err != nil {
		return "", fmt.Errorf("nothing answers on %s and no throwaway server could be started: %w", u.Host, err)
	}
	stops = append(stops, stop)
	// Worker processes that tests start inherit the environment: point them
	// at this server rather than letting each start one of its own.
	if err := os.Setenv(env, started); err != nil {
		return "", err
	}
	exported = append(exported, env)
	return started, nil
}

// StopAll stops the throwaway servers this process started. TestMain calls it
// (through [Main]) after the tests ran; examples defer it.
func StopAll() error {
	mu.Lock()
	defer mu.Unlock()
	var errs []error
	for _, stop := range stops {
		if err := stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, env := range exported {
		os.Unsetenv(env)
	}
	stops, exported, pgURL, redisURL, mariaURL = nil, nil, "", "", ""
	if len(errs) > 0 {
		return fmt.Errorf("testserver: stop: %v", errs)
	}
	return nil
}

// RandomName returns prefix followed by 16 random hex digits: a name no other
// test or process picks.
func RandomName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// CreateSchema creates a fresh schema on the server at serverURL and returns
// its name and a URL whose connections use it as their search_path. Both
// drivers pass unknown URL parameters to the server as run-time settings.
func CreateSchema(ctx context.Context, serverURL string) (schema, schemaURL string, err error) {
	schema = RandomName("contend_")
	db, err := sql.Open("pgx", serverURL)
	if err != nil {
		return "", "", err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", "", fmt.Errorf("testserver: create schema: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return schema, u.String(), nil
}

// Schema creates a fresh schema on the discovered server (see the package
// doc) and returns a URL whose connections use it, and a function that drops
// it. Programs (examples, the benchmark suite) use it where tests use
// [Postgres].
func Schema(ctx context.Context) (url string, drop func() error, err error) {
	server, err := PostgresURL()
	if err != nil {
		return "", nil, err
	}
	schema, url, err := CreateSchema(ctx, server)
	if err != nil {
		return "", nil, err
	}
	return url, func() error { return DropSchema(context.WithoutCancel(ctx), server, schema) }, nil
}

// DropSchema drops a schema made by [CreateSchema] and everything in it.
func DropSchema(ctx context.Context, serverURL, schema string) error {
	db, err := sql.Open("pgx", serverURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	return err
}

// Postgres creates an isolated schema for t and returns a URL whose
// connections use it; the schema is dropped when t ends. It fails t when no
// server can be had.
func Postgres(t testing.TB) string {
	t.Helper()
	server, err := PostgresURL()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	schema, u, err := CreateSchema(ctx, server)
	if err != nil {
		t.Fatalf("%v (server %s)", err, server)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(ctx, dropTimeout)
		defer cancel()
		if t.Failed() {
			// A failed test may have left a call behind that still holds a
			// lock in the schema, and the DROP would wait for it forever.
			terminate(ctx, server, schema)
		}
		if err := DropSchema(ctx, server, schema); err != nil {
			t.Errorf("testserver: drop schema %s: %v (a session of the test still holds a lock in it: a call was left behind)", schema, err)
		}
	})
	return u
}

// dropTimeout bounds the drop of a test's schema or database: a session
// left behind holding a lock makes it wait, and the test then fails with a
// named error instead of hanging.
const dropTimeout = 30 * time.Second

// terminate ends the PostgreSQL sessions that hold a lock in schema; its
// errors are of no interest, the drop that follows reports what stays.
func terminate(ctx context.Context, serverURL, schema string) {
	db, err := sql.Open("pgx", serverURL)
	if err != nil {
		return
	}
	defer db.Close()
	_, _ = db.ExecContext(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()`, schema)
}

// MaxConns caps the connections of each pool [Open] makes. The local server
// allows 100 connections in all, and tests run several processes and packages
// at once; goroutines beyond the cap queue for a connection, so contention on
// the server is still real.
const MaxConns = 10

// Open opens url with driver, at most [MaxConns] connections, and closes the
// pool when t ends. Under [PgxNative] it opens pgx's stdlib driver, for the
// test's own statements; under [MariaDBDriver], go-sql-driver/mysql on the
// DSN of a mysql:// URL, unwrapped.
func Open(t testing.TB, driver, url string) *sqlx.DB {
	t.Helper()
	var db *sqlx.DB
	if driver == MariaDBDriver {
		d, err := openMariaDB(url)
		if err != nil {
			t.Fatal(err)
		}
		db = sqlx.NewDb(d, "mysql")
	} else {
		d, err := sqlx.Open(sqlDriver(driver), url)
		if err != nil {
			t.Fatal(err)
		}
		db = d
	}
	db.SetMaxOpenConns(MaxConns)
	// database/sql keeps 2 idle connections by default: a pool with more
	// workers than that would reconnect all the time, and measure it.
	db.SetMaxIdleConns(MaxConns)
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("testserver: connect %s: %v", driver, err)
	}
	return db
}

// DB returns a pool on an isolated schema of its own for t, through driver.
func DB(t testing.TB, driver string) *sqlx.DB {
	t.Helper()
	return Open(t, driver, URL(t, driver))
}

// Redis returns a client and a key prefix that no other test uses; keys under
// the prefix are deleted and the client closed when t ends. Tests put every key
// they touch under the prefix.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	client := redis.NewClient(RedisOptions(t))
	prefix := RandomName("contend:test:") + ":"
	if err := client.Ping(context.Background()).Err(); err != nil {
		client.Close()
		t.Fatalf("testserver: redis at %s: %v", client.Options().Addr, err)
	}
	t.Cleanup(func() {
		if err := DeletePrefix(context.Background(), client, prefix); err != nil {
			t.Errorf("testserver: clean redis prefix %s: %v", prefix, err)
		}
		client.Close()
	})
	return client, prefix
}

// RedisOptions returns new options for a client of the test server, for a
// test that wants a client of its own beside Redis's: a copy of a made
// client's Options() shares what its making set up in them (go-redis
// then logs that it cannot register its push handlers again).
func RedisOptions(t testing.TB) *redis.Options {
	t.Helper()
	u, err := RedisURL()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// DeletePrefix deletes every key under prefix.
func DeletePrefix(ctx context.Context, client redis.UniversalClient, prefix string) error {
	pattern := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(prefix) + "*"
	iter := client.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			if err := client.Del(ctx, keys...).Err(); err != nil {
				return err
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) > 0 {
		return client.Del(ctx, keys...).Err()
	}
	return nil
}

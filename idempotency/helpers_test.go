package idempotency_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/contend/contend"
	"github.com/contend/contend/idempotency"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/testserver"
)

func TestMain(m *testing.M) { testserver.MainWaiting(m, 4) }

// drivers are every handle the store runs on.
var drivers = append(append([]string{}, testserver.AllDrivers...), testserver.MariaDBDriver)

// env is one test's database: the subject's handle and the test's own.
type env struct {
	driver  string
	url     string
	db      contend.DB // what the store is built on
	own     *sqlx.DB   // the test's own statements
	dialect sqldb.Dialect
}

func newEnv(t testing.TB, driver string) *env {
	t.Helper()
	url := testserver.URL(t, driver)
	e := &env{driver: driver, url: url, own: testserver.Open(t, driver, url), dialect: testserver.Dialect(driver)}
	createTables(t, e.own, e.dialect)
	e.db = testserver.Handle(t, driver, url)
	return e
}

// reopen is e on the database e.url names, for a worker process: the
// tables exist already.
func reopen(t testing.TB, driver, url string) *env {
	t.Helper()
	return &env{driver: driver, url: url, own: testserver.Open(t, driver, url), dialect: testserver.Dialect(driver),
		db: testserver.Handle(t, driver, url)}
}

// The tables, as the package doc gives them, and the effects fn writes:
// without a unique key, so that a second effect shows.
var ddl = map[sqldb.Dialect][]string{
	sqldb.Postgres: {
		`CREATE TABLE idem (id text PRIMARY KEY, fingerprint text NOT NULL, state smallint NOT NULL,
			answer bytea, fence bigint NOT NULL, expires_at timestamptz NOT NULL)`,
		`CREATE INDEX ON idem (expires_at)`,
		`CREATE TABLE effects (n bigserial PRIMARY KEY, k text NOT NULL, fingerprint text NOT NULL, answer text NOT NULL)`,
	},
	sqldb.MySQL: {
		"CREATE TABLE idem (id VARCHAR(255) PRIMARY KEY, fingerprint VARCHAR(255) NOT NULL, state SMALLINT NOT NULL, " +
			"answer LONGBLOB, fence BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, INDEX (expires_at)) ENGINE=InnoDB",
		"CREATE TABLE effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(255) NOT NULL, fingerprint VARCHAR(255) NOT NULL, answer TEXT NOT NULL) ENGINE=InnoDB",
	},
}

func createTables(t testing.TB, db *sqlx.DB, d sqldb.Dialect) {
	t.Helper()
	for _, s := range ddl[d] {
		_, err := db.Exec(s)
		require.NoError(t, err)
	}
}

var param = regexp.MustCompile(`\$\d+`)

// q is query, written with $n, in e's dialect.
func (e *env) q(query string) string {
	if e.dialect == sqldb.MySQL {
		return param.ReplaceAllString(query, "?")
	}
	return query
}

func (e *env) store(t testing.TB, cfg idempotency.Config) *idempotency.Store {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = "idem"
	}
	s, err := idempotency.New(e.db, cfg)
	require.NoError(t, err)
	return s
}

// effect is an fn that writes one effect row for key and fingerprint in
// the store's transaction and answers with what it wrote.
func (e *env) effect(key, fingerprint string) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		return e.writeEffect(ctx, key, fingerprint)
	}
}

func (e *env) writeEffect(ctx context.Context, key, fingerprint string) ([]byte, error) {
	answer := fmt.Sprintf("%s/%s/%d", key, fingerprint, rand.Int64())
	// The work a request does before its write (a price looked up, a
	// service called): the window in which a duplicate runs too.
	time.Sleep(2 * time.Millisecond)
	_, err := testserver.Querier(ctx, e.db).Exec(ctx, e.q(`INSERT INTO effects (k, fingerprint, answer) VALUES ($1, $2, $3)`), key, fingerprint, answer)
	if err != nil {
		return nil, err
	}
	return []byte(answer), nil
}

// effects counts key's effect rows.
func (e *env) effects(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, e.own.Get(&n, e.q(`SELECT count(*) FROM effects WHERE k = $1`), key))
	return n
}

// records counts key's records.
func (e *env) records(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, e.own.Get(&n, e.q(`SELECT count(*) FROM idem WHERE id = $1`), key))
	return n
}

// forDrivers runs test on every driver, in parallel.
func forDrivers(t *testing.T, test func(t *testing.T, e *env)) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, driver))
		})
	}
}

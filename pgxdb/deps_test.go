package pgxdb_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deps lists the packages a program importing pkgs links, test code aside.
func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	args := append([]string{"list", "-deps"}, pkgs...)
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Fields(string(out))
}

func hasPrefix(pkgs []string, prefix string) []string {
	var found []string
	for _, p := range pkgs {
		if strings.HasPrefix(p, prefix) {
			found = append(found, p)
		}
	}
	return found
}

// A pgx user's binary links no lib/pq: the SQL strategies quote, pass
// arrays and classify errors without it.
func TestPgxProgramLinksNoLibPQ(t *testing.T) {
	t.Parallel()
	all := deps(t, "github.com/contend/contend/pgxdb", "github.com/contend/contend/atomic",
		"github.com/contend/contend/pessimistic", "github.com/contend/contend/optimistic")
	require.Contains(t, all, "github.com/jackc/pgx/v5", "the check must see pgx, or it sees nothing")
	require.Empty(t, hasPrefix(all, "github.com/lib/pq"))
	require.Empty(t, hasPrefix(all, "github.com/go-sql-driver/"))
}

// A database/sql user's binary links no pgx: only package pgxdb imports it.
func TestDatabaseSQLProgramLinksNoPgx(t *testing.T) {
	t.Parallel()
	all := deps(t, "github.com/contend/contend", "github.com/contend/contend/atomic",
		"github.com/contend/contend/pessimistic", "github.com/contend/contend/optimistic")
	require.Contains(t, all, "github.com/contend/contend/internal/sqldb", "the check must see the strategies' deps")
	require.Empty(t, hasPrefix(all, "github.com/jackc/"))
	require.Empty(t, hasPrefix(all, "github.com/lib/pq"))
	require.Empty(t, hasPrefix(all, "github.com/go-sql-driver/"), "only package mysqldb imports the MySQL driver")
}

// A MySQL user's binary links no PostgreSQL driver: package mysqldb is the
// only one that imports go-sql-driver/mysql, and nothing of pgx or lib/pq.
func TestMySQLProgramLinksNoPostgresDriver(t *testing.T) {
	t.Parallel()
	all := deps(t, "github.com/contend/contend/mysqldb", "github.com/contend/contend/atomic",
		"github.com/contend/contend/pessimistic", "github.com/contend/contend/optimistic")
	require.Contains(t, all, "github.com/go-sql-driver/mysql", "the check must see the driver, or it sees nothing")
	require.Empty(t, hasPrefix(all, "github.com/jackc/"))
	require.Empty(t, hasPrefix(all, "github.com/lib/pq"))
}

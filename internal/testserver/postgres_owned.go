package testserver

import "testing"

// OwnedPostgres is a PostgreSQL server that belongs to one test: the test
// may stop it and start it again on the same port, as in "the database
// restarted mid-transaction". Its data survives a restart, as a real
// server's does; transactions under way when it stopped are rolled back.
//
// The shared server that [Postgres] hands out must never be stopped: other
// tests and other engineers use it.
type OwnedPostgres struct{ *owned }

// OwnPostgres initialises and starts a throwaway PostgreSQL server for t
// alone, on a free port of 127.0.0.1, from the locally installed binaries
// (the ones a throwaway server is started from). It is stopped and its
// directory removed when t ends. It fails t when no server can be started.
// Its URL names the database "postgres".
func OwnPostgres(t testing.TB) *OwnedPostgres {
	t.Helper()
	d, err := initPostgres("contend-postgres-owned-")
	if err != nil {
		t.Fatal(err)
	}
	return &OwnedPostgres{own(t, d)}
}

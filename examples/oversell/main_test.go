package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
	"github.com/contend/contend/internal/workers"
)

// The test binary doubles as the server processes, as the program does.
func TestMain(m *testing.M) {
	if isWorker() {
		os.Exit(workerMain())
	}
	testserver.Main(m)
}

// From a clean start, in one call: the naive mutex oversells across three
// processes, and every strategy sells exactly the stock.
func TestOversell(t *testing.T) {
	quickRaceExit(t)
	ok, err := run("postgres", 3, 8, 60)
	require.NoError(t, err)
	require.True(t, ok, "see the table above")
}

// The same on MariaDB, through mysqldb: the naive mutex oversells, and
// atomic, pessimistic, optimistic and distlock sell exactly the stock.
func TestOversellOnMariaDB(t *testing.T) {
	if _, err := testserver.MariaDBURL(); err != nil {
		t.Fatal(err)
	}
	quickRaceExit(t)
	ok, err := run("mariadb", 3, 8, 60)
	require.NoError(t, err)
	require.True(t, ok, "see the table above")
}

// quickRaceExit spares the server processes, copies of the test binary
// waited for as they exit, the second each takes under -race unless told
// not to.
func quickRaceExit(t *testing.T) {
	if gorace, ok := workers.QuickRaceExit(); ok {
		t.Setenv("GORACE", gorace)
	}
}

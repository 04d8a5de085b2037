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
	// The server processes are copies of the test binary, waited for as
	// they exit, which under -race takes a second each unless told not to.
	if gorace, ok := workers.QuickRaceExit(); ok {
		t.Setenv("GORACE", gorace)
	}
	ok, err := run(3, 8, 60)
	require.NoError(t, err)
	require.True(t, ok, "see the table above")
}

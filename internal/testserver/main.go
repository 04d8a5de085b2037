package testserver

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// Main runs a package's tests, then stops the throwaway servers they started
// and fails the run if a goroutine was left behind. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testserver.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if err := StopAll(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left behind after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// MainWaiting is [Main] for a package whose parallel tests spend their time
// waiting (on leases, timers, servers restarting), not on a CPU: unless
// -test.parallel is given, up to n of them run at once. The default,
// GOMAXPROCS, runs two at a time on a 2-core machine, as if each needed a
// core, and the package's run is the sum of its waits. Pick n so that the
// parallel tests' connections to the shared servers stay few.
func MainWaiting(m *testing.M, n int) {
	// Flags are parsed here, before m.Run would, to tell whether the
	// command line set -test.parallel.
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(fmt.Sprintf("testserver: set -test.parallel: %v", err))
		}
	}
	Main(m)
}

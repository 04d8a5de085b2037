package testserver

import (
	"fmt"
	"os"
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

// Package subtest runs subtests that spend their time waiting, on timers,
// servers or other processes, at once.
package subtest

import (
	"sync"
	"testing"
)

// A Test is a subtest: its name and its function, for t.Run.
type Test struct {
	Name string
	F    func(t *testing.T)
}

// Together runs tests as subtests of t at once and returns when all have
// ended. They are not made parallel tests: -parallel, GOMAXPROCS by
// default, would run two of them at a time on a 2-core machine, as if each
// needed a core, and only once t's own function has returned. Each runs on
// a goroutine of its own, which t.Run allows.
func Together(t *testing.T, tests ...Test) {
	var wg sync.WaitGroup
	for _, st := range tests {
		wg.Go(func() { t.Run(st.Name, st.F) })
	}
	wg.Wait()
}

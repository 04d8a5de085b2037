package contendtest

import (
	"fmt"
	"sync"
)

// Race calls fn(i) for i from 0 to n-1, each on a goroutine of its own, and
// returns what each call returned, errs[i] for fn(i). The goroutines are
// started first and released together, so the calls arrive as close to
// at once as the scheduler allows: the contention a guard exists for, in
// one test. A panic in fn is returned as that call's error.
//
// Race checks nothing itself: check the invariant of the code under test
// (stock never below zero, one claim per job) after it returns, and count
// the outcomes in errs. Run the test with -race. Race panics if n < 1.
func Race(n int, fn func(i int) error) (errs []error) {
	if n < 1 {
		panic(fmt.Sprintf("contendtest: Race with n = %d, need at least 1", n))
	}
	errs = make([]error, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			defer func() {
				if v := recover(); v != nil {
					errs[i] = fmt.Errorf("contendtest: call %d panicked: %v", i, v)
				}
			}()
			ready.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errs
}

package harness

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// inFlight knows what each goroutine of a run is doing, and when an
// operation last returned, so that a run that no longer moves can say so
// instead of waiting forever.
type inFlight struct {
	last  atomic.Int64 // UnixNano of the last return, or of the start
	slots []slot
}

// slot is one goroutine's current operation; its own goroutine writes it,
// the watcher reads it only after a stall.
type slot struct {
	mu    sync.Mutex
	key   string
	began time.Time // zero while no operation runs
}

func newInFlight(goroutines int) *inFlight {
	f := &inFlight{slots: make([]slot, goroutines)}
	f.last.Store(time.Now().UnixNano())
	return f
}

func (f *inFlight) begin(g int, key string) time.Time {
	now := time.Now()
	s := &f.slots[g]
	s.mu.Lock()
	s.key, s.began = key, now
	s.mu.Unlock()
	return now
}

func (f *inFlight) end(g int, began time.Time) time.Duration {
	now := time.Now()
	f.last.Store(now.UnixNano())
	s := &f.slots[g]
	s.mu.Lock()
	s.began = time.Time{}
	s.mu.Unlock()
	return now.Sub(began)
}

// watch waits for wg, and returns "" once it is done; or, when no operation
// has returned for stall, a description of the calls still in flight.
func (f *inFlight) watch(wg *sync.WaitGroup, stall time.Duration) string {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(min(stall/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-done:
			return ""
		case now := <-tick.C:
			if now.Sub(time.Unix(0, f.last.Load())) >= stall {
				return f.describe(now, stall)
			}
		}
	}
}

func (f *inFlight) describe(now time.Time, stall time.Duration) string {
	var (
		n       int
		keys    = map[string]int{}
		longest time.Duration
	)
	for i := range f.slots {
		s := &f.slots[i]
		s.mu.Lock()
		if !s.began.IsZero() {
			n++
			keys[s.key]++
			longest = max(longest, now.Sub(s.began))
		}
		s.mu.Unlock()
	}
	return fmt.Sprintf("no operation returned for %v: %d calls still in flight (by key: %v), the oldest for %v; the operation waits forever, or lost a caller",
		stall, n, keys, longest.Round(time.Millisecond))
}

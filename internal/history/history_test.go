package history

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func inc(key string, read, call, ret int64) Op {
	return Op{Key: key, Kind: Increment, Value: read, Call: call, Return: ret}
}

func maybe(key string, call int64) Op {
	return Op{Key: key, Kind: Maybe, Call: call, Return: Pending}
}

func read(key string, v, call, ret int64) Op {
	return Op{Key: key, Kind: Observe, Value: v, Call: call, Return: ret}
}

// Hand-written histories with known verdicts: the checker must accept every
// order a counter allows and refuse the lost update, the stale read, a write
// that overtook real time, and an unknown outcome counted twice.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		name string
		ops  []Op
		ok   bool
	}{
		{"empty", nil, true},
		{"sequential", []Op{inc("a", 0, 0, 10), inc("a", 1, 20, 30), read("a", 2, 40, 50)}, true},
		{"overlapping, returned out of order", []Op{inc("a", 1, 0, 30), inc("a", 0, 5, 10)}, true},
		{"closed intervals touch", []Op{inc("a", 0, 0, 10), inc("a", 1, 10, 20)}, true},
		{"keys are separate counters", []Op{inc("a", 0, 0, 10), inc("b", 0, 0, 10), inc("a", 1, 20, 30)}, true},
		{"maybe took effect", []Op{inc("a", 0, 0, 10), maybe("a", 5), inc("a", 2, 20, 30)}, true},
		{"maybe did not", []Op{inc("a", 0, 0, 10), maybe("a", 5), inc("a", 1, 20, 30)}, true},
		{"maybe takes effect after it returned", []Op{maybe("a", 0), inc("a", 0, 20, 30), inc("a", 2, 40, 50)}, true},
		{"maybe in the final read", []Op{inc("a", 0, 0, 10), maybe("a", 5), read("a", 2, 40, 50)}, true},

		{"lost update", []Op{inc("a", 0, 0, 10), inc("a", 0, 5, 15)}, false},
		{"stale read", []Op{inc("a", 0, 0, 10), inc("a", 1, 20, 30), inc("a", 1, 40, 50)}, false},
		{"real-time order broken", []Op{inc("a", 1, 0, 10), inc("a", 0, 20, 30)}, false},
		{"lost update on one key of two", []Op{inc("b", 0, 0, 10), inc("a", 0, 0, 10), inc("a", 0, 20, 30)}, false},
		{"maybe counted twice", []Op{inc("a", 0, 0, 10), maybe("a", 5), inc("a", 3, 20, 30)}, false},
		{"maybe before its call", []Op{inc("a", 0, 0, 10), inc("a", 2, 20, 30), maybe("a", 35)}, false},
		{"final read lost an increment", []Op{inc("a", 0, 0, 10), inc("a", 1, 20, 30), read("a", 1, 40, 50)}, false},
		{"final read from nowhere", []Op{inc("a", 0, 0, 10), read("a", 2, 40, 50)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := Check(Log{Ops: c.ops}, time.Second)
			t.Log(res)
			require.Equal(t, c.ok, res.Linearizable())
			require.Empty(t, res.Unknown)
			if !c.ok {
				require.Equal(t, []string{"a"}, res.Illegal, "only the key with the anomaly is accused")
				var html bytes.Buffer
				require.NoError(t, res.Visualize(&html, "a", time.Second))
				require.Contains(t, html.String(), "<html")
			}
		})
	}
}

func TestCheckBreachIsAViolation(t *testing.T) {
	res := Check(Log{Ops: []Op{inc("a", 0, 0, 10)}, Breaches: []string{"fn wrote after Do returned"}}, time.Second)
	require.False(t, res.Linearizable())
	require.Equal(t, 1, res.Violations())
}

// What the recorder makes of each way a call can end, and which attempt's
// start each operation's interval begins at.
func TestRecorder(t *testing.T) {
	r := NewRecorder(2)
	failed := errors.New("connection reset")

	c := r.Begin("a")
	c.Reading()
	c.Sending(4)
	c.Reading() // a guard ran fn again: the last attempt counts
	second := Now()
	c.Sending(6)
	c.End(nil)

	c = r.Begin("a")
	c.Reading()
	first := Now()
	c.Sending(7)
	c.Reading()
	c.Sending(8)
	c.End(failed)

	r.Begin("a").End(failed) // failed before fn wrote: no effect possible

	c = r.Begin("b")
	c.End(nil) // success without a write
	c.Sending(0)

	l := r.Log()
	require.Len(t, l.Ops, 2)
	inc, maybe := l.Ops[0], l.Ops[1]
	require.Equal(t, Op{Process: 2, Key: "a", Kind: Increment, Value: 6, Call: inc.Call, Return: inc.Return}, inc)
	require.LessOrEqual(t, inc.Call, second, "the interval starts at the last attempt")
	require.Less(t, second-inc.Call, int64(time.Millisecond))
	require.LessOrEqual(t, second, inc.Return)
	require.Equal(t, Op{Process: 2, Key: "a", Kind: Maybe, Call: maybe.Call, Return: Pending}, maybe)
	require.LessOrEqual(t, maybe.Call, first, "an unknown outcome may come from the first attempt that wrote")
	require.Less(t, inc.Return, maybe.Call)
	require.Equal(t, 1, l.Unsent)
	require.Len(t, l.Breaches, 2)
	require.Contains(t, l.Breaches[0], "never wrote")
	require.Contains(t, l.Breaches[1], "after Do returned")

	var merged Log
	merged.Merge(l)
	merged.Merge(l)
	require.Len(t, merged.Ops, 4)
	require.Equal(t, 2, merged.Unsent)
}

// Goroutines that take turns under a mutex record a linearizable history,
// and the same increments without the mutex, with a pause between read and
// write, lose updates that the checker sees.
func TestRecordedGoroutines(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		var (
			guard   sync.Mutex // the guard under test
			store   sync.Mutex // makes each read and each write atomic, nothing more
			counter int64
			wg      sync.WaitGroup
		)
		r := NewRecorder(0)
		for range 8 {
			wg.Go(func() {
				for range 20 {
					c := r.Begin("k")
					if guarded {
						guard.Lock()
					}
					c.Reading()
					store.Lock()
					v := counter
					store.Unlock()
					time.Sleep(100 * time.Microsecond)
					c.Sending(v)
					store.Lock()
					counter = v + 1
					store.Unlock()
					if guarded {
						guard.Unlock()
					}
					c.End(nil)
				}
			})
		}
		wg.Wait()
		l := r.Log()
		l.Ops = append(l.Ops, Observed("k", Now(), counter))
		res := Check(l, 10*time.Second)
		t.Logf("guarded %v: %v", guarded, res)
		require.Equal(t, guarded, res.Linearizable())
	}
}

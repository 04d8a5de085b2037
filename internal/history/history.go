// Package history records what concurrent increments of counters did, in
// every process of a test, and checks the record for linearizability with
// porcupine: is there one order of the operations, each placed at a moment
// between its call and its return, in which every increment read the value
// the one before it wrote?
//
// An operation is a read-modify-write of one counter (key): read v, write
// v+1. What its caller learns decides what the record may claim about it:
//
//   - [Increment]: the call returned success after fn read Value and sent
//     Value+1. The write took effect, once, before the return.
//   - [Maybe]: the call returned an error after fn had sent its write. The
//     write may have taken effect or not (a reset connection loses the reply
//     to a COMMIT that ran), and it may take effect at any moment after the
//     call, even after the return (a statement still in flight when the
//     caller gave up). The record gives it no return ([Pending]) and the
//     model lets it add one or nothing.
//   - [Observe]: a read of the counter outside any guard, such as the final
//     value after the run.
//
// A call that returned an error before fn sent its write cannot have changed
// the counter and is left out; the [Recorder] counts it. A write fn sends
// after Do returned, and a success without a write, are breaches of the Guard
// contract, recorded apart and counted as violations.
//
// The model cannot tell a failed call's late write of the value the counter
// already holds from no write at all: a stale write shows only when it moves
// the counter back, and a later read then sees a value the history cannot
// explain.
//
// An operation's interval starts when fn begins the attempt that reads, not
// when Do is called: both the read and the write happen inside fn, after that
// moment, so a guard that keeps its promise makes each read-modify-write take
// effect at one moment between it and Do's return. Leaving out the time spent
// waiting for the guard keeps the intervals short, which makes the check both
// stricter and fast: with long overlapping intervals, proving a history with
// many lost updates illegal takes the checker time exponential in them.
//
// Timestamps are CLOCK_MONOTONIC, read by [Now]. On Linux that clock is one
// per machine, not one per process, so the calls and returns of several
// processes on one machine compare directly; unlike the wall clock it never
// steps (NTP may slew its rate, which keeps the order). Go's own monotonic
// reading, inside [time.Time], is relative to each process's start and does
// not compare across processes.
package history

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/sys/unix"
)

// Kind says what an operation is known to have done.
type Kind uint8

// The kinds of operation; see the package doc.
const (
	// Increment read Value and wrote Value+1, once, before it returned.
	Increment Kind = iota + 1
	// Maybe added one or nothing, at some moment after its call.
	Maybe
	// Observe read Value.
	Observe
)

func (k Kind) String() string {
	switch k {
	case Increment:
		return "inc"
	case Maybe:
		return "maybe"
	case Observe:
		return "read"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Pending is the return time of an operation whose effect, if any, may come
// at any later time: a [Maybe].
const Pending int64 = math.MaxInt64

// An Op is one operation of a history.
type Op struct {
	Process int    `json:"process"`
	Key     string `json:"key"`
	Kind    Kind   `json:"kind"`
	// Value is what an Increment or an Observe read.
	Value int64 `json:"value,omitempty"`
	// Call is [Now] when fn began the attempt that read (for a Maybe, the
	// first attempt that sent a write), Return when Do returned; Return is
	// [Pending] for a Maybe.
	Call   int64 `json:"call"`
	Return int64 `json:"return"`
}

func (o Op) String() string {
	switch o.Kind {
	case Increment:
		return fmt.Sprintf("%s: %d→%d", o.Key, o.Value, o.Value+1)
	case Observe:
		return fmt.Sprintf("%s: read %d", o.Key, o.Value)
	}
	return fmt.Sprintf("%s: +1?", o.Key)
}

// Now returns CLOCK_MONOTONIC in nanoseconds: one clock for every process
// of the machine (see the package doc).
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// Linux has always had it; anywhere else the check means nothing.
		panic("history: CLOCK_MONOTONIC: " + err.Error())
	}
	return ts.Nano()
}

// Observed returns the Observe operation of a read of key that began at call
// and saw v; it returns now.
func Observed(key string, call, v int64) Op {
	return Op{Process: -1, Key: key, Kind: Observe, Value: v, Call: call, Return: Now()}
}

// A Recorder records the operations of one process. It is safe for
// simultaneous use by multiple goroutines.
type Recorder struct {
	process int

	mu       sync.Mutex // protects the fields below
	ops      []Op
	unsent   int      // calls that failed before fn sent a write
	breaches []string // calls that broke the Guard contract outright
}

// NewRecorder returns a recorder whose operations carry process.
func NewRecorder(process int) *Recorder { return &Recorder{process: process} }

// Process is the process r's operations carry.
func (r *Recorder) Process() int { return r.process }

// Begin records the call of an operation on key.
func (r *Recorder) Begin(key string) *Call {
	return &Call{r: r, key: key, attempt: Now()}
}

// A Call is one operation under way. Its methods may be called from the
// goroutine that runs fn as well as from the caller's.
type Call struct {
	r   *Recorder
	key string

	mu        sync.Mutex // protects the fields below
	attempt   int64      // when the current attempt of fn began
	firstSent int64      // when the first attempt that sent a write began
	lastSent  int64      // when the last attempt that sent a write began
	sent      bool
	read      int64
	ended     bool
}

// Reading records that fn begins an attempt: call it first thing in fn,
// before the read.
func (c *Call) Reading() {
	now := Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempt = now
}

// Sending records that fn read v and is about to send v+1. Call it right
// before the write, on every attempt of a guard that runs fn again: the
// last attempt's read is the one a success reports.
func (c *Call) Sending(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		c.r.breach(fmt.Sprintf("%s: fn wrote %d after Do returned", c.key, v+1))
	}
	if !c.sent {
		c.firstSent = c.attempt
	}
	c.sent, c.read, c.lastSent = true, v, c.attempt
}

// End records the return of the call, with the error it returned.
func (c *Call) End(err error) {
	ret := Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	op := Op{Process: c.r.process, Key: c.key}
	switch {
	case err == nil && !c.sent:
		c.r.breach(fmt.Sprintf("%s: Do returned success but fn never wrote", c.key))
		return
	case err == nil:
		op.Kind, op.Value, op.Call, op.Return = Increment, c.read, c.lastSent, ret
	case c.sent:
		op.Kind, op.Call, op.Return = Maybe, c.firstSent, Pending
	default:
		c.r.mu.Lock()
		c.r.unsent++
		c.r.mu.Unlock()
		return
	}
	c.r.mu.Lock()
	c.r.ops = append(c.r.ops, op)
	c.r.mu.Unlock()
}

func (r *Recorder) breach(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.breaches = append(r.breaches, fmt.Sprintf("process %d: %s", r.process, msg))
}

// A Log is what a recorder holds: what one process or, merged, a whole run
// did.
type Log struct {
	Ops []Op `json:"ops"`
	// Unsent counts the calls that failed before fn sent a write: they
	// cannot have changed a counter and are not in Ops.
	Unsent int `json:"unsent"`
	// Breaches are calls that broke the Guard contract in a way no order
	// can excuse: success without a write, a write after Do returned.
	Breaches []string `json:"breaches"`
}

// Log returns a copy of what r recorded so far.
func (r *Recorder) Log() Log {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Log{Ops: slices.Clone(r.ops), Unsent: r.unsent, Breaches: slices.Clone(r.breaches)}
}

// Merge adds o to l.
func (l *Log) Merge(o Log) {
	l.Ops = append(l.Ops, o.Ops...)
	l.Unsent += o.Unsent
	l.Breaches = append(l.Breaches, o.Breaches...)
}

// span is the state of the model: the counter holds one of the values lo to
// hi. A Maybe widens it by one at the top; an Increment or an Observe needs
// the value it read to be in it, and leaves exactly one value.
type span struct{ lo, hi int64 }

func (s span) step(o Op) (bool, span) {
	switch o.Kind {
	case Increment:
		return s.lo <= o.Value && o.Value <= s.hi, span{o.Value + 1, o.Value + 1}
	case Observe:
		return s.lo <= o.Value && o.Value <= s.hi, span{o.Value, o.Value}
	case Maybe:
		return true, span{s.lo, s.hi + 1}
	}
	return false, s
}

// counter is the sequential specification of one counter that starts at
// zero: the model every key's history is checked against.
var counter = porcupine.Model{
	Init: func() any { return span{} },
	Step: func(state, input, _ any) (bool, any) {
		return state.(span).step(input.(Op))
	},
	DescribeOperation: func(input, _ any) string { return input.(Op).String() },
	DescribeState: func(state any) string {
		s := state.(span)
		if s.lo == s.hi {
			return fmt.Sprint(s.lo)
		}
		return fmt.Sprintf("%d..%d", s.lo, s.hi)
	},
}

// Result is the verdict on a history, key by key.
type Result struct {
	// Ops, Keys and Processes count what was checked; Maybes counts the
	// operations among Ops whose outcome was unknown.
	Ops, Keys, Processes, Maybes int
	// Illegal lists the keys whose history no order explains, Unknown the
	// keys the checker could not decide in time, both sorted.
	Illegal, Unknown []string
	// Breaches are copied from the log: each one is a violation too.
	Breaches []string
	// Took is how long the check took.
	Took time.Duration

	byKey map[string][]porcupine.Operation
}

// Linearizable reports whether every key's history was found linearizable
// and no call broke the contract.
func (r Result) Linearizable() bool {
	return len(r.Illegal) == 0 && len(r.Unknown) == 0 && len(r.Breaches) == 0
}

// Violations counts the keys found not linearizable plus the breaches.
func (r Result) Violations() int { return len(r.Illegal) + len(r.Breaches) }

func (r Result) String() string {
	return fmt.Sprintf("%d ops (%d unknown outcome) from %d processes on %d keys checked in %v: %d not linearizable %v, %d undecided %v, %d breaches %v",
		r.Ops, r.Maybes, r.Processes, r.Keys, r.Took.Round(time.Millisecond), len(r.Illegal), r.Illegal, len(r.Unknown), r.Unknown, len(r.Breaches), r.Breaches)
}

// Check checks each key's history in l against a counter that starts at
// zero, giving each key at most timeout (0: no limit).
func Check(l Log, timeout time.Duration) Result {
	began := time.Now()
	res := Result{Ops: len(l.Ops), Breaches: l.Breaches, byKey: map[string][]porcupine.Operation{}}
	processes := map[int]bool{}
	for _, o := range l.Ops {
		if o.Kind != Observe {
			processes[o.Process] = true
		}
		if o.Kind == Maybe {
			res.Maybes++
		}
		res.byKey[o.Key] = append(res.byKey[o.Key], porcupine.Operation{
			ClientId: max(o.Process, 0), Input: o, Call: o.Call, Return: o.Return,
		})
	}
	res.Keys, res.Processes = len(res.byKey), len(processes)
	for _, key := range slices.Sorted(maps.Keys(res.byKey)) {
		switch porcupine.CheckOperationsTimeout(counter, res.byKey[key], timeout) {
		case porcupine.Illegal:
			res.Illegal = append(res.Illegal, key)
		case porcupine.Unknown:
			res.Unknown = append(res.Unknown, key)
		}
	}
	res.Took = time.Since(began)
	return res
}

// Visualize writes porcupine's HTML view of key's history to w: the
// operations on a time line and the longest orders the checker found.
func (r Result) Visualize(w io.Writer, key string, timeout time.Duration) error {
	ops, ok := r.byKey[key]
	if !ok {
		return fmt.Errorf("history: no operations on key %q", key)
	}
	_, info := porcupine.CheckOperationsVerbose(counter, ops, timeout)
	return porcupine.Visualize(counter, info, w)
}

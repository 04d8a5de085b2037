package share

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// A caller as the model sees it: where it is in its call.
type caller struct {
	key     string
	arrived int     // the step at which its call began
	rd      *flight // the statement it waits for, sends or shares
	state   callerState
}

type callerState int

const (
	waiting callerState = iota // for its read's turn
	sending                    // its read, which it sent
	sharing                    // a read another caller sent
)

// TestCoreStateMachine runs generated sequences of arrivals, turns, ends
// of reads (answered, or given up by their sender) and callers' ctxs
// ending, on two keys, against a model of the callers, checking after each
// step that at most one read of a key is in flight, that a caller takes
// only the answer of a read that began after it arrived, and that nothing
// of a key is kept once none of its callers is around.
func TestCoreStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := core{keys: map[string]*entry{}}
		var (
			step    int
			callers []*caller
			began   = map[*flight]int{} // the step at which each read was sent
		)
		keys := rapid.SampledFrom([]string{"a", "b"})
		pick := func(t *rapid.T, ok func(*caller) bool) *caller {
			var in []*caller
			for _, cl := range callers {
				if ok(cl) {
					in = append(in, cl)
				}
			}
			if len(in) == 0 {
				t.Skip("no such caller")
			}
			return rapid.SampledFrom(in).Draw(t, "caller")
		}
		remove := func(cl *caller) {
			for i, x := range callers {
				if x == cl {
					callers = append(callers[:i], callers[i+1:]...)
					return
				}
			}
		}
		sendingOf := func(key string) int {
			n := 0
			for _, cl := range callers {
				if cl.key == key && cl.state == sending {
					n++
				}
			}
			return n
		}
		arrive := func(cl *caller) {
			inFlight := c.keys[cl.key] != nil
			rd, lead := c.arrive(cl.key)
			require.Equal(t, !inFlight, lead, "a caller sends at once exactly when nothing of its key is under way")
			cl.rd = rd
			cl.state = waiting
			if lead {
				cl.state = sending
				began[rd] = step
			}
		}
		// take is a caller whose read ended noticing it, and taking its
		// answer, or reading again when its sender gave up.
		take := func(t *rapid.T, cl *caller) {
			rd := cl.rd
			if rd.again != nil {
				cl.rd, cl.state = rd.again, waiting
				return
			}
			require.Greater(t, began[rd], cl.arrived, "a caller took the answer of a read that began before it arrived")
			remove(cl)
		}
		t.Repeat(map[string]func(*rapid.T){
			"arrive": func(t *rapid.T) {
				step++
				cl := &caller{key: keys.Draw(t, "key"), arrived: step}
				callers = append(callers, cl)
				arrive(cl)
			},
			"turn": func(t *rapid.T) {
				// A waiting caller sees its read's turn come.
				cl := pick(t, func(cl *caller) bool { return cl.state == waiting && closed(cl.rd.turn) })
				step++
				sent := sendingOf(cl.key)
				if c.start(cl.key, cl.rd) {
					require.Zero(t, sent, "a read was sent while another of its key was in flight")
					cl.state = sending
					began[cl.rd] = step
					return
				}
				cl.state = sharing
				if closed(cl.rd.done) {
					take(t, cl)
				}
			},
			"finish": func(t *rapid.T) {
				// A sender's read returns: answered, or failed because the
				// sender's ctx ended.
				cl := pick(t, func(cl *caller) bool { return cl.state == sending })
				gaveUp := rapid.Bool().Draw(t, "gave up")
				step++
				var err error
				if gaveUp {
					err = context.Canceled
				}
				c.finish(cl.key, cl.rd, 7, err, gaveUp)
				require.True(t, closed(cl.rd.done))
				remove(cl)
			},
			"notice": func(t *rapid.T) {
				// A sharer sees its read end.
				cl := pick(t, func(cl *caller) bool { return cl.state == sharing && closed(cl.rd.done) })
				step++
				take(t, cl)
			},
			"depart": func(t *rapid.T) {
				// The ctx of a caller that did not send its read ends:
				// it leaves at once, whatever its read is doing.
				cl := pick(t, func(cl *caller) bool { return cl.state != sending })
				step++
				c.depart(cl.key, cl.rd)
				remove(cl)
			},
			"": func(t *rapid.T) {
				for _, key := range []string{"a", "b"} {
					require.LessOrEqual(t, sendingOf(key), 1, "two reads of a key in flight")
					around := 0
					for _, cl := range callers {
						if cl.key == key {
							around++
						}
					}
					e := c.keys[key]
					if around == 0 {
						require.Nil(t, e, "a key nobody calls for is kept")
						continue
					}
					if e != nil {
						require.Equal(t, sendingOf(key) == 1, e.sent != nil, "the read in flight is the one a caller sends")
					}
				}
				for _, cl := range callers {
					if cl.state != waiting {
						continue
					}
					// A waiter's read began after it arrived, or has not
					// begun: then it is its key's next.
					if at, sent := began[cl.rd]; sent {
						require.Greater(t, at, cl.arrived, "a caller waits for a read that began before it arrived")
						continue
					}
					require.Same(t, c.keys[cl.key].next, cl.rd, "a waiter's read is not its key's next")
				}
			},
		})
	})
}

func closed(ch chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// gate is a read whose calls each block until the test answers them.
type gate struct {
	calls chan call
}

type call struct {
	ctx    context.Context
	answer chan result
}

type result struct {
	n   int64
	err error
}

func newGate() *gate { return &gate{calls: make(chan call)} }

func (g *gate) read(ctx context.Context, _, _ string) (int64, error) {
	c := call{ctx: ctx, answer: make(chan result)}
	g.calls <- c
	r := <-c.answer
	return r.n, r.err
}

type outcome struct {
	n   int64
	err error
}

func start(r *Calls, ctx context.Context, key string) chan outcome {
	out := make(chan outcome, 1)
	go func() {
		n, _, err := r.Do(ctx, key, "")
		out <- outcome{n, err}
	}()
	return out
}

// Callers that arrive while a read is in flight wait for it, and share the
// next, which only one of them sends; the first read's answer is its
// sender's alone.
func TestDoSharesTheNextRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		r := New(g.read)
		first := start(r, t.Context(), "k")
		c1 := <-g.calls
		var later []chan outcome
		for range 5 {
			later = append(later, start(r, t.Context(), "k"))
		}
		synctest.Wait()
		require.Equal(t, 6, r.Callers("k"))
		c1.answer <- result{n: 1}
		require.Equal(t, outcome{n: 1}, <-first)
		c2 := <-g.calls
		synctest.Wait()
		c2.answer <- result{n: 2}
		for _, out := range later {
			require.Equal(t, outcome{n: 2}, <-out)
		}
		require.EqualValues(t, 2, r.Sent())
		require.Zero(t, r.Callers("k"))
		require.Empty(t, r.c.keys)
	})
}

// idKey marks a caller's ctx, so that the test can tell which of the
// callers waiting for a turn sends the read.
type idKey struct{}

// callersOf starts n callers of key, each under a ctx of its own, and
// returns their outcomes and the cancel funcs of their ctxs.
func callersOf(r *Calls, parent context.Context, key string, n int) ([]chan outcome, []context.CancelCauseFunc) {
	var outs []chan outcome
	var cancels []context.CancelCauseFunc
	for i := range n {
		ctx, cancel := context.WithCancelCause(context.WithValue(parent, idKey{}, i))
		outs = append(outs, start(r, ctx, key))
		cancels = append(cancels, cancel)
	}
	return outs, cancels
}

// A caller whose ctx ends returns at once, while the read it waits for, or
// shares, is still in flight.
func TestDoReturnsWhenCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		r := New(g.read)
		first := start(r, t.Context(), "k")
		c1 := <-g.calls
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := errors.New("caller gone")
		waiter := start(r, ctx, "k")
		synctest.Wait()
		cancel(cause)
		require.ErrorIs(t, (<-waiter).err, cause)
		require.Equal(t, 1, r.Callers("k"))

		// A sharer of the second read leaves while it is in flight.
		outs, cancels := callersOf(r, t.Context(), "k", 2)
		synctest.Wait()
		c1.answer <- result{n: 1}
		<-first
		c2 := <-g.calls
		sender := c2.ctx.Value(idKey{}).(int)
		sharer := 1 - sender
		synctest.Wait()
		cancels[sharer](cause)
		require.ErrorIs(t, (<-outs[sharer]).err, cause)
		c2.answer <- result{n: 2}
		require.Equal(t, outcome{n: 2}, <-outs[sender])
		require.Empty(t, r.c.keys)
	})
}

// A read that fails because its sender's ctx ended is not its sharers'
// answer: one of them sends the read again. A server's error is shared.
func TestDoRetriesWhenTheSenderGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		r := New(g.read)
		first := start(r, t.Context(), "k")
		c1 := <-g.calls
		outs, cancels := callersOf(r, t.Context(), "k", 4)
		synctest.Wait()
		c1.answer <- result{n: 1}
		<-first
		c2 := <-g.calls
		sender := c2.ctx.Value(idKey{}).(int)
		synctest.Wait()
		cancels[sender](context.Canceled)
		c2.answer <- result{err: fmt.Errorf("read: %w", c2.ctx.Err())}
		require.ErrorIs(t, (<-outs[sender]).err, context.Canceled)
		c3 := <-g.calls
		require.NotEqual(t, sender, c3.ctx.Value(idKey{}).(int))
		serverErr := errors.New("server says no")
		c3.answer <- result{err: serverErr}
		for i, out := range outs {
			if i != sender {
				require.ErrorIs(t, (<-out).err, serverErr)
			}
		}
		// The third read was the sharers' own: none of them read again.
		require.EqualValues(t, 3, r.Sent())
		require.Empty(t, r.c.keys)
	})
}

// Reads of different keys do not wait for each other; many callers of one
// key under the race detector leave nothing behind.
func TestDoUnderLoad(t *testing.T) {
	var sent sync.Map
	r := New(func(ctx context.Context, key, _ string) (int64, error) {
		sent.Store(key, true)
		return int64(len(key)), nil
	})
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			key := []string{"a", "bb"}[i%2]
			for range 100 {
				n, _, err := r.Do(context.Background(), key, "")
				if err != nil || n != int64(len(key)) {
					panic(fmt.Sprintf("%q: %d, %v", key, n, err))
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, r.c.keys)
	require.LessOrEqual(t, r.Sent(), int64(64*100))
}

// The statement runs with the argument of the caller that sends it, and
// only that caller is told it sent it: a claim's win is its sender's, a
// loss to the others.
func TestDoTellsOnlyTheSender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		args := make(chan string, 8)
		release := make(chan struct{})
		r := New(func(ctx context.Context, _, arg string) (int64, error) {
			args <- arg
			<-release
			return 7, nil
		})
		type got struct {
			arg  string
			sent bool
		}
		outs := make(chan got, 8)
		do := func(arg string) {
			n, sent, err := r.Do(t.Context(), "k", arg)
			if n != 7 || err != nil {
				panic(fmt.Sprintf("%d, %v", n, err))
			}
			outs <- got{arg, sent}
		}
		go do("first")
		require.Equal(t, "first", <-args)
		for _, arg := range []string{"a", "b", "c"} {
			go do(arg)
		}
		synctest.Wait()
		release <- struct{}{}
		require.Equal(t, got{"first", true}, <-outs)
		sender := <-args
		require.Contains(t, []string{"a", "b", "c"}, sender)
		release <- struct{}{}
		for range 3 {
			g := <-outs
			require.Equal(t, g.arg == sender, g.sent, "%+v, sent by %q", g, sender)
		}
		require.Empty(t, args)
	})
}

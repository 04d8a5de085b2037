package distlock

import (
	stdflag "flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The line of one key, driven by generated sequences of events for a few
// goroutines of one Client, against a model of what Redis's scripts do to
// the lock, the queue and the fencing counter, and of another process that
// takes, queues for and releases the key. After every step the invariants
// below must hold. Calls are sent, run by the model (once, or again as
// go-redis re-sends after a lost reply), and answered or lost, in any
// order the generator picks; messages are delivered or lost; rechecks fire
// and ctxs end at any time.
func TestLineInterleavings(t *testing.T) {
	if f := stdflag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue && !testing.Short() {
		// At least 20,000 sequences in CI, unless told otherwise.
		_ = f.Value.Set("20000")
		defer func() { _ = f.Value.Set(f.DefValue) }()
	}
	rapid.Check(t, func(t *rapid.T) {
		w := newWorld(t, rapid.IntRange(2, 4).Draw(t, "goroutines"))
		t.Repeat(w.actions())
	})
}

// A redisModel is what the scripts of lib.lua, queue.lua and the Client's
// scripts do, over one key, without time: a lock value, the queue (whose
// entries say whether the waiter is this client's), and the counter.
type redisModel struct {
	lock  string
	queue []qentry
	fence int64
	msgs  []string // grant messages published to this client, undelivered
}

type qentry struct {
	tok   string
	local bool // a waiter of the client under test
}

func holdsValue(v, tok string) bool { return v == tok || v == tok+"|q" }

func (r *redisModel) nextFence() int64 { r.fence++; return r.fence }

func (r *redisModel) dequeue(tok string) {
	r.queue = slices.DeleteFunc(r.queue, func(e qentry) bool { return e.tok == tok })
}

func (r *redisModel) enqueue(tok string, local bool, cur string) {
	if !slices.ContainsFunc(r.queue, func(e qentry) bool { return e.tok == tok }) {
		r.queue = append(r.queue, qentry{tok, local})
	}
	if cur != "" && !strings.HasSuffix(cur, "|q") && !strings.HasSuffix(cur, "|g") {
		r.lock = cur + "|q"
	}
}

// grantNext is queue.lua's grant_next: direct says which waiters are the
// caller's process's, handed the lock at once.
func (r *redisModel) grantNext(self string, direct func(qentry) bool) string {
	// Every waiter of the model renews its place: none is skipped.
	if len(r.queue) == 0 {
		return ""
	}
	e := r.queue[0]
	r.queue = r.queue[1:]
	switch {
	case e.tok == self:
		return "self"
	case direct(e):
		r.lock = e.tok
		return fmt.Sprintf("%s %d", e.tok, r.nextFence())
	}
	r.lock = e.tok + "|g"
	if e.local {
		r.msgs = append(r.msgs, e.tok)
	}
	return "granted"
}

func (r *redisModel) released(f int64) int64 {
	if r.fence != 0 && r.fence == f {
		return replyGone
	}
	return replyNotHeld
}

func (r *redisModel) take(tok string) int64 {
	switch {
	case r.lock == "":
		r.lock = tok
		if len(r.queue) > 0 {
			r.lock = tok + "|q"
		}
		return r.nextFence()
	case holdsValue(r.lock, tok):
		return r.fence
	}
	return 0
}

func (r *redisModel) acquire(tok string, local bool) (bool, int64) {
	cur := r.lock
	switch {
	case cur == tok+"|g":
		r.dequeue(tok)
		r.lock = tok
		return true, r.nextFence()
	case holdsValue(cur, tok):
		r.dequeue(tok)
		return true, r.fence
	case cur == "":
		if len(r.queue) == 0 || r.grantNext(tok, func(qentry) bool { return false }) != "granted" {
			r.lock = tok
			return true, r.nextFence()
		}
	}
	r.enqueue(tok, local, cur)
	return false, 0
}

func (r *redisModel) pass(holder, next string) int64 {
	switch {
	case r.lock == next:
		return r.fence
	case !holdsValue(r.lock, holder):
		return 0
	}
	r.lock = next
	return r.nextFence()
}

func (r *redisModel) free(tok string, f int64) int64 {
	switch r.lock {
	case tok:
		r.lock = ""
		return replyReleased
	case tok + "|q":
		return replyQueued
	}
	return r.released(f)
}

// release is release.lua, run by this client (ours) or the other process;
// next is the waiter taken along, if any.
func (r *redisModel) release(tok string, f int64, givingUp bool, next string, inTurn, ours bool) (held int64, msg string, turn bool) {
	if givingUp {
		r.dequeue(tok)
	}
	cur := r.lock
	if next != "" && holdsValue(cur, next) {
		return replyReleased, fmt.Sprintf("%s %d", next, r.fence), inTurn
	}
	switch {
	case holdsValue(cur, tok) || cur == tok+"|g":
		held = replyReleased
	case cur != "":
		if next != "" {
			r.enqueue(next, ours, cur)
		}
		return r.released(f), "", false
	default:
		held = r.released(f)
	}
	if held == replyReleased && next != "" && inTurn {
		r.lock = next
		return held, fmt.Sprintf("%s %d", next, r.nextFence()), true
	}
	switch g := r.grantNext("", func(e qentry) bool { return e.local == ours }); g {
	case "granted":
		if next != "" {
			r.enqueue(next, ours, "")
		}
		return held, "", false
	case "":
	default:
		return held, g, false
	}
	if next != "" {
		r.lock = next
		return held, fmt.Sprintf("%s %d", next, r.nextFence()), false
	}
	if held == replyReleased {
		r.lock = ""
	}
	return held, "", false
}

// A world is one key: the model of Redis, the line of the client under
// test, its goroutines, the calls in flight, and the other process.
type world struct {
	t     *rapid.T
	r     redisModel
	line  line
	gs    []*goroutine
	calls []*call
	all   []*waiter       // every waiter made, for the refusals
	left  map[string]bool // tokens of waiters whose caller returned without the lock
	// excused are tokens whose leave was lost before it reached Redis:
	// what they had there lapses with its lease, which the model does not
	// run.
	excused map[string]bool
	fence   int64 // the largest fencing token this client was given
	toks    int
	now     time.Time
}

type gstate int

const (
	gIdle     gstate = iota
	gCall            // waiting for a call's reply
	gSleeping        // waiting in line for a wake, a recheck or its ctx
	gHolding         // holds the lock
)

type goroutine struct {
	id       int
	st       gstate
	w        *waiter
	wait     bool // Obtain, not TryObtain
	attempts int
	fence    int64
	taken    bool // the lock came from take
}

// A call is a script sent to the model: run applies it (again, when
// re-sent), deliver gives its reply, or its loss, to whoever sent it.
type call struct {
	name    string
	leaveOf string // the token a leave is for
	ran     bool
	run     func()
	deliver func(lost bool)
}

func newWorld(t *rapid.T, n int) *world {
	w := &world{t: t, left: map[string]bool{}, excused: map[string]bool{}, now: time.Unix(1e9, 0)}
	for i := range n {
		w.gs = append(w.gs, &goroutine{id: i})
	}
	return w
}

func (w *world) tok(prefix string) string {
	w.toks++
	return fmt.Sprintf("%s%d", prefix, w.toks)
}

func (w *world) send(name string, run func(), deliver func(lost bool)) *call {
	c := &call{name: name, run: run, deliver: deliver}
	w.calls = append(w.calls, c)
	return c
}

func (w *world) must(ok bool, event string) {
	if !ok {
		w.t.Fatalf("the line refused %s, which the driver only sends when allowed", event)
	}
}

// obtain is Client.obtain for g: Obtain if wait, else TryObtain.
func (w *world) obtain(g *goroutine, wait bool) {
	g.w, g.wait, g.attempts = &waiter{tok: w.tok("w"), ttl: time.Hour}, wait, 0
	w.all = append(w.all, g.w)
	w.t.Logf("g%d: %s as %s", g.id, map[bool]string{true: "Obtain", false: "TryObtain"}[wait], g.w.tok)
	g.st = gCall
	if wait {
		g.w.wake = make(chan grant, 1)
		deferred, busy, ok := w.line.join(g.w, w.now)
		w.must(ok, "join")
		if deferred || busy {
			w.startWait(g, !deferred)
			return
		}
	}
	var fence int64
	w.send("take "+g.w.tok, func() { fence = w.r.take(g.w.tok) }, func(lost bool) {
		switch {
		case lost:
			w.depart(g)
		case fence > 0:
			w.must(w.line.obtained(g.w, w.now.Add(time.Hour), false), "obtained")
			w.holding(g, fence, true)
		case wait:
			w.startWait(g, true)
		default:
			g.st = gIdle
		}
	})
}

func (w *world) startWait(g *goroutine, attempt bool) {
	g.st = gSleeping
	if attempt {
		w.attempt(g)
	}
}

// attempt is attemptInLine.
func (w *world) attempt(g *goroutine) {
	g.st = gCall
	g.attempts++
	first := g.attempts == 1
	var ok bool
	var fence int64
	w.send("acquire "+g.w.tok, func() { ok, fence = w.r.acquire(g.w.tok, true) }, func(lost bool) {
		switch {
		case lost:
			w.depart(g)
		case ok:
			w.must(w.line.obtained(g.w, w.now.Add(time.Hour), first), "obtained")
			w.holding(g, fence, false)
		default:
			w.must(w.line.queued(g.w), "queued")
			g.st = gSleeping
		}
	})
}

func (w *world) holding(g *goroutine, fence int64, taken bool) {
	if fence <= w.fence {
		w.t.Fatalf("%s got fence %d after %d", g.w.tok, fence, w.fence)
	}
	w.fence = fence
	g.st, g.fence, g.taken = gHolding, fence, taken
}

// depart is the clean-up of a wait that ended without the lock.
func (w *world) depart(g *goroutine) {
	s, ok := w.line.depart(g.w)
	w.must(ok, "depart")
	w.left[g.w.tok] = true
	g.st = gIdle
	w.act(s)
}

func (w *world) act(s step) {
	for _, u := range s.wakes {
		wake(u.w, u.g)
	}
	for _, tok := range s.leave {
		along, inTurn := w.line.beginRelease(tok)
		w.release(nil, tok, 0, true, along, inTurn)
	}
}

// releaseLock is Client.release for g's lock.
func (w *world) releaseLock(g *goroutine) {
	w.t.Logf("g%d: Release %s", g.id, g.w.tok)
	g.st = gCall
	tok := g.w.tok
	along, inTurn := w.line.beginRelease(tok)
	switch {
	case g.taken && along == nil:
		var n int64
		w.send("free "+tok, func() { n = w.r.free(tok, g.fence) }, func(lost bool) {
			if lost || n != replyQueued {
				w.endRelease(g, tok, nil, outcome{lost: lost})
				return
			}
			w.release(g, tok, g.fence, false, nil, false)
		})
	case along != nil && inTurn:
		var fence int64
		w.send("pass "+tok+" to "+along.tok, func() { fence = w.r.pass(tok, along.tok) }, func(lost bool) {
			switch {
			case lost:
				w.endRelease(g, tok, along, outcome{lost: true})
				return
			case fence > 0:
				w.endRelease(g, tok, along, outcome{next: along.tok, fence: fence, at: w.now, inTurn: true})
				return
			}
			w.release(g, tok, g.fence, false, along, true)
		})
	default:
		w.release(g, tok, g.fence, false, along, inTurn)
	}
}

// release is runRelease's release script, for g's lock, or for a leave
// (g nil).
func (w *world) release(g *goroutine, tok string, fence int64, givingUp bool, along *waiter, inTurn bool) {
	next := ""
	if along != nil {
		next = along.tok
	}
	var msg string
	var turn bool
	c := w.send(fmt.Sprintf("release %s (leave %v, along %q)", tok, givingUp, next), func() {
		_, msg, turn = w.r.release(tok, fence, givingUp, next, inTurn, true)
	}, func(lost bool) {
		o := outcome{lost: lost, at: w.now, inTurn: turn}
		if !lost {
			o = released(msg, turn, w.now)
		}
		w.endRelease(g, tok, along, o)
	})
	if givingUp {
		c.leaveOf = tok
	}
}

func (w *world) endRelease(g *goroutine, tok string, along *waiter, o outcome) {
	s, ok := w.line.endRelease(tok, along, o)
	w.must(ok, "endRelease")
	if g != nil {
		g.st = gIdle
	}
	w.act(s)
}

// wakeUp is what a sleeping g does when its wait's select picks the wake
// channel (grant) or its recheck timer.
func (w *world) wakeUp(g *goroutine, byTimer bool) {
	w.t.Logf("g%d wakes (%s, recheck %v)", g.id, g.w.tok, byTimer)
	if !byTimer {
		if gr := <-g.w.wake; gr.fence > 0 {
			w.holding(g, gr.fence, false)
			return
		}
	}
	attempt, ok := w.line.rejoin(g.w, w.now)
	w.must(ok, "rejoin")
	if attempt {
		w.attempt(g)
	}
}

func pick[T any](t *rapid.T, what string, all []T, ok func(T) bool) T {
	var cands []T
	for _, x := range all {
		if ok(x) {
			cands = append(cands, x)
		}
	}
	if len(cands) == 0 {
		t.Skip("no " + what)
	}
	return rapid.SampledFrom(cands).Draw(t, what)
}

func (w *world) goroutine(what string, st gstate) *goroutine {
	return pick(w.t, what, w.gs, func(g *goroutine) bool { return g.st == st })
}

func (w *world) call(what string, ok func(*call) bool) *call {
	c := pick(w.t, what, w.calls, ok)
	w.t.Logf("%s: %s", what, c.name)
	return c
}

func (w *world) answer(c *call, lost bool) {
	w.calls = slices.DeleteFunc(w.calls, func(d *call) bool { return d == c })
	c.deliver(lost)
}

func (w *world) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"":          func(*rapid.T) { w.check() },
		"Obtain":    func(*rapid.T) { w.obtain(w.goroutine("idle goroutine", gIdle), true) },
		"TryObtain": func(*rapid.T) { w.obtain(w.goroutine("idle goroutine", gIdle), false) },
		"Release":   func(*rapid.T) { w.releaseLock(w.goroutine("holder", gHolding)) },
		"run": func(*rapid.T) {
			c := w.call("run", func(c *call) bool { return !c.ran })
			c.run()
			c.ran = true
		},
		"resend": func(*rapid.T) { w.call("resend", func(c *call) bool { return c.ran }).run() },
		"reply":  func(*rapid.T) { w.answer(w.call("reply", func(c *call) bool { return c.ran }), false) },
		"lose": func(t *rapid.T) {
			c := w.call("lose", func(*call) bool { return true })
			if !c.ran && rapid.Bool().Draw(t, "ran before the loss") {
				c.run()
				c.ran = true
			}
			if !c.ran && c.leaveOf != "" {
				// A leave that never reached Redis leaves what it was to
				// give up to its lease, as the doc says.
				w.excused[c.leaveOf] = true
			}
			w.answer(c, true)
		},
		"wake": func(*rapid.T) {
			g := pick(w.t, "woken goroutine", w.gs, func(g *goroutine) bool { return g.st == gSleeping && len(g.w.wake) > 0 })
			w.wakeUp(g, false)
		},
		"recheck": func(*rapid.T) { w.wakeUp(w.goroutine("sleeping goroutine", gSleeping), true) },
		"ctx ends": func(*rapid.T) {
			g := w.goroutine("sleeping goroutine", gSleeping)
			w.t.Logf("g%d's ctx ends (%s)", g.id, g.w.tok)
			w.depart(g)
		},
		"message": func(t *rapid.T) {
			if len(w.r.msgs) == 0 {
				t.Skip("no message")
			}
			tok := w.r.msgs[0]
			w.r.msgs = w.r.msgs[1:]
			if rapid.Bool().Draw(t, "message lost") {
				return
			}
			for _, g := range w.gs {
				if g.w != nil && g.w.tok == tok && g.st != gIdle && g.w.wake != nil {
					wake(g.w, grant{})
				}
			}
		},
		"other process": w.other,
		"refused":       w.refused,
	}
}

// other is a step of another process on the key: it takes it, queues for
// it, releases it, turns its reservation into a hold, a reservation lapses
// after its grant lease, or its holder dies and its lease runs out.
func (w *world) other(t *rapid.T) {
	r := &w.r
	mine := func(v string) bool { return strings.HasPrefix(v, "x") }
	switch rapid.IntRange(0, 5).Draw(t, "other's step") {
	case 0:
		r.take(w.tok("x"))
	case 1:
		r.acquire(w.tok("x"), false)
	case 2:
		if !mine(r.lock) || strings.HasSuffix(r.lock, "|g") {
			t.Skip("the other process holds nothing")
		}
		r.release(strings.TrimSuffix(r.lock, "|q"), 0, false, "", false, false)
	case 3:
		if !mine(r.lock) || !strings.HasSuffix(r.lock, "|g") {
			t.Skip("nothing reserved for the other process")
		}
		r.acquire(strings.TrimSuffix(r.lock, "|g"), false)
	case 4:
		if !strings.HasSuffix(r.lock, "|g") {
			t.Skip("no reservation")
		}
		r.lock = ""
	case 5:
		if !mine(r.lock) || strings.HasSuffix(r.lock, "|g") {
			t.Skip("the other process holds nothing")
		}
		r.lock = "" // its holder died: the lease ran out
	}
	t.Logf("other process: lock %q, queue %v", r.lock, r.queue)
}

// check is the invariants, after every step.
func (w *world) check() {
	w.t.Logf("  line: %s", w.snapshot())
	holders := 0
	for _, g := range w.gs {
		if g.st == gHolding {
			holders++
			if !holdsValue(w.r.lock, g.w.tok) {
				w.t.Fatalf("%s believes it holds the lock, which is %q", g.w.tok, w.r.lock)
			}
		}
	}
	if holders > 1 {
		w.t.Fatalf("%d holders", holders)
	}
	for _, g := range w.gs {
		if g.st == gSleeping && g.w.phase == holding && len(g.w.wake) == 0 {
			// It would sleep until its recheck with the lock its own.
			w.t.Fatalf("%s was handed the lock, and nothing wakes it", g.w.tok)
		}
	}
	if len(w.calls) > 0 || len(w.r.msgs) > 0 {
		return
	}
	// Quiescent: every clean-up is done.
	if h := w.line.head; h != nil {
		live := slices.ContainsFunc(w.gs, func(g *goroutine) bool { return g.w == h && g.st != gIdle })
		if !live || h.phase == left {
			w.t.Fatalf("the head %s (phase %d) is not a live waiter: the key is lost to this client", h.tok, h.phase)
		}
		if w.r.lock == "" && h.phase == holding {
			w.t.Fatalf("the head %s holds a key that is free", h.tok)
		}
	}
	for tok := range w.left {
		has := strings.HasPrefix(w.r.lock, tok+"|") || w.r.lock == tok ||
			slices.ContainsFunc(w.r.queue, func(e qentry) bool { return e.tok == tok })
		if has && !w.excused[tok] {
			w.t.Fatalf("%s left, and still has the lock %q or a place in the queue %v", tok, w.r.lock, w.r.queue)
		}
	}
}

// refused sends the line an event that its table forbids for a waiter in
// its phase, and checks that the line refuses it and changes nothing.
func (w *world) refused(t *rapid.T) {
	if len(w.all) == 0 {
		t.Skip("no waiter")
	}
	x := rapid.SampledFrom(w.all).Draw(t, "waiter")
	l := &w.line
	p := x.phase
	in := func(ps ...phase) bool { return slices.Contains(ps, p) }
	type event struct {
		allowed bool
		run     func() bool
	}
	events := map[string]event{
		"join":     {in(joining), func() bool { _, _, ok := l.join(x, w.now); return ok }},
		"obtained": {in(joining, asking) || p == holding && l.head == x, func() bool { return l.obtained(x, w.now, false) }},
		"queued":   {in(asking, holding), func() bool { return l.queued(x) }},
		"depart":   {in(joining, deferred, asking, sent, holding), func() bool { _, ok := l.depart(x); return ok }},
		"rejoin":   {in(deferred, asking, sent, holding), func() bool { _, ok := l.rejoin(x, w.now); return ok }},
		"endRelease": {x == l.along, func() bool {
			_, ok := l.endRelease(rapid.SampledFrom(w.all).Draw(t, "releaser").tok, x, outcome{})
			return ok
		}},
	}
	name := rapid.SampledFrom([]string{"join", "obtained", "queued", "depart", "rejoin", "endRelease"}).Draw(t, "event")
	e := events[name]
	if e.allowed {
		t.Skip("allowed")
	}
	before := w.snapshot()
	if e.run() {
		t.Fatalf("the line accepted %s for %s in phase %d", name, x.tok, p)
	}
	if after := w.snapshot(); after != before {
		t.Fatalf("a refused %s changed the line:\n%s\n%s", name, before, after)
	}
}

func (w *world) snapshot() string {
	l := &w.line
	var b strings.Builder
	tok := func(x *waiter) string {
		if x == nil {
			return "-"
		}
		return x.tok
	}
	fmt.Fprintf(&b, "head %s until %v along %s by %q turn %d busy %v behind", tok(l.head), l.until, tok(l.along), l.by, l.turn, l.busy)
	for _, x := range l.behind {
		b.WriteString(" " + x.tok)
	}
	b.WriteString(" asked")
	for _, x := range l.asked {
		b.WriteString(" " + x.tok)
	}
	for _, x := range w.all {
		fmt.Fprintf(&b, " %s:%d", x.tok, x.phase)
	}
	return b.String()
}

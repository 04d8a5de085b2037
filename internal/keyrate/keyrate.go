// Package keyrate keeps, per key, how often its recent calls lost a race,
// and whether that makes the key hot: what a guard that changes how it
// works per key (the adaptive guard's lock) decides from. A key turns hot
// when its rate reaches Enter and cools when it falls to Leave, staying at
// least half a window in a state it moved to before it moves again: the gap
// between the thresholds and that stay keep a key whose rate hovers near one
// of them from flapping. A key new to the table moves as soon as its rate
// crosses, and its rate is the plain mean of its samples until it has a
// window of them: a new key's first lost race counts for what it says (a
// running average that started at zero would need about a fifth of a
// window of them in a row to reach a threshold of 0.2, and as many calls
// of a key that just turned hot would pay for the wait).
package keyrate

import (
	"hash/maphash"
	"math/bits"
	"sync"
)

// Config says when a key turns hot and cools; every field must be set.
type Config struct {
	// Window is about how many recent samples a key's rate averages over.
	Window int
	// Enter is the rate, in (0, 1], at which a key turns hot.
	Enter float64
	// Leave is the rate, in (0, Enter), at which a hot key cools.
	Leave float64
	// Keys is how many keys' rates are kept, rounded up to a power of two.
	Keys int
}

// Table keeps each key's rate and state in a fixed number of slots, in
// pairs: a hash of the key picks the pair, and the key takes either slot of
// it. Memory stays bounded whatever the keys, and a lookup is one hash and
// one uncontended-in-the-common-case mutex. A newcomer whose pair is full
// evicts, and starts over, cold: it takes the slot of a cold key rather
// than a hot one's, and of two alike the one recorded less recently. So a
// hot key keeps its state against the cold keys that share its pair (one
// slot per key, direct-mapped, would lose it each time one of them came,
// and send the key's next calls back to the state it just left). An LRU
// over all keys would keep a hot key against a stream of cold ones too,
// but its list is one more shared structure every call would write to. A
// Table is safe for simultaneous use by multiple goroutines.
type Table struct {
	seed         maphash.Seed
	mask         uint64 // of a pair's index
	pairs        []pair
	alpha        float64 // weight of a new sample: 1/Window
	window       int
	enter, leave float64
	dwell        int // samples a key stays in a state it moved to before it may leave it
}

// A pair is the two slots a key may take.
type pair struct {
	mu    sync.Mutex // protects the fields below
	slots [2]slot
	older int // the slot recorded less recently
}

// A slot is one key's state.
type slot struct {
	hash  uint64 // the key's; 0 marks an empty slot
	hot   bool
	rate  float64 // conflicts per sample, averaged over about 1/alpha samples (over seen, while fewer)
	since int     // samples since the key entered its state; dwell for a newcomer
	seen  int     // samples since the key took its slot, up to the window
}

// New returns an empty table for c, which the caller has validated.
func New(c Config) *Table {
	n := uint64(1) << bits.Len(uint(max(c.Keys, 2)-1)) // slots, in pairs
	return &Table{
		seed:   maphash.MakeSeed(),
		mask:   n/2 - 1,
		pairs:  make([]pair, n/2),
		alpha:  1 / float64(c.Window),
		window: c.Window,
		enter:  c.Enter,
		leave:  c.Leave,
		dwell:  (c.Window + 1) / 2,
	}
}

func (t *Table) hash(key string) uint64 {
	h := maphash.String(t.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// find returns the slot of p that holds the key of hash h, or -1.
func (p *pair) find(h uint64) int {
	switch h {
	case p.slots[0].hash:
		return 0
	case p.slots[1].hash:
		return 1
	}
	return -1
}

// victim returns the slot of p a newcomer takes: an empty one, else a cold
// key's rather than a hot one's, else the one recorded less recently.
func (p *pair) victim() int {
	a, b := &p.slots[0], &p.slots[1]
	switch {
	case a.hash == 0:
		return 0
	case b.hash == 0:
		return 1
	case a.hot != b.hot:
		if a.hot {
			return 1
		}
		return 0
	}
	return p.older
}

// Hot reports whether key is hot.
func (t *Table) Hot(key string) bool {
	h := t.hash(key)
	p := &t.pairs[h&t.mask]
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.find(h)
	return i >= 0 && p.slots[i].hot
}

// Record adds samples observations, conflicts of them conflicts, to key's
// rate, turns key hot or cools it when the rate crossed its threshold, and
// reports whether key is hot. Observations made in the state the key is no
// longer in (calls that began before it changed) still count: they
// measured the key.
func (t *Table) Record(key string, samples, conflicts int) (hot bool) {
	h := t.hash(key)
	p := &t.pairs[h&t.mask]
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.find(h)
	if i < 0 {
		i = p.victim()
		// A newcomer has not moved: it may as soon as its rate says so.
		// The stay keeps a key that just moved from moving back on the
		// samples that moved it; a newcomer's first samples are all it
		// has, and on a key that just turned hot, making it wait half a
		// window more is the lag of every call that comes meanwhile.
		p.slots[i] = slot{hash: h, since: t.dwell}
	}
	p.older = 1 - i
	s := &p.slots[i]
	// Conflicts first: of a call's samples, the lost attempts came before the
	// one that won.
	for i := range samples {
		x := 0.0
		if i < conflicts {
			x = 1
		}
		a := t.alpha
		if s.seen < t.window {
			s.seen++
			a = 1 / float64(s.seen)
		}
		s.rate += (x - s.rate) * a
	}
	s.since += samples
	if s.since < t.dwell {
		return s.hot
	}
	switch {
	case !s.hot && s.rate >= t.enter:
		s.hot, s.since = true, 0
	case s.hot && s.rate <= t.leave:
		s.hot, s.since = false, 0
	}
	return s.hot
}

// Package keyrate keeps, per key, how often its recent calls lost a race,
// and whether that makes the key hot: what a guard that changes how it
// works per key (the adaptive guard's lock, the claimer's read first)
// decides from. A key turns hot when its rate reaches Enter and cools when
// it falls to Leave, staying at least half a window in a state before it
// moves again: the gap between the thresholds and that stay keep a key
// whose rate hovers near one of them from flapping.
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

// Table keeps each key's rate and state in a fixed number of slots,
// direct-mapped by a hash of the key: memory stays bounded whatever the
// keys, and a lookup is one hash and one uncontended-in-the-common-case
// mutex. A collision evicts: the newcomer starts over, cold. An LRU would
// keep a hot key against a stream of cold ones, but its list is one more
// shared structure every call would write to. A Table is safe for
// simultaneous use by multiple goroutines.
type Table struct {
	seed         maphash.Seed
	mask         uint64
	slots        []slot
	alpha        float64 // weight of a new sample: 1/Window
	enter, leave float64
	dwell        int // samples a key stays in a state before it may leave it
}

// A slot is one key's state.
type slot struct {
	mu    sync.Mutex // protects the fields below
	hash  uint64     // the key's; 0 marks an empty slot
	hot   bool
	rate  float64 // conflicts per sample, averaged over about 1/alpha samples
	since int     // samples since the key entered its state
}

// New returns an empty table for c, which the caller has validated.
func New(c Config) *Table {
	n := uint64(1) << bits.Len(uint(c.Keys-1))
	return &Table{
		seed:  maphash.MakeSeed(),
		mask:  n - 1,
		slots: make([]slot, n),
		alpha: 1 / float64(c.Window),
		enter: c.Enter,
		leave: c.Leave,
		dwell: (c.Window + 1) / 2,
	}
}

func (t *Table) hash(key string) uint64 {
	h := maphash.String(t.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// Hot reports whether key is hot.
func (t *Table) Hot(key string) bool {
	h := t.hash(key)
	s := &t.slots[h&t.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hash == h && s.hot
}

// Record adds samples observations, conflicts of them conflicts, to key's
// rate, turns key hot or cools it when the rate crossed its threshold, and
// reports whether key is hot. Observations made in the state the key is no
// longer in (calls that began before it changed) still count: they
// measured the key.
func (t *Table) Record(key string, samples, conflicts int) (hot bool) {
	h := t.hash(key)
	s := &t.slots[h&t.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hash != h {
		s.hash, s.hot, s.rate, s.since = h, false, 0, 0
	}
	// Conflicts first: of a call's samples, the lost attempts came before the
	// one that won.
	for i := range samples {
		x := 0.0
		if i < conflicts {
			x = 1
		}
		s.rate += (x - s.rate) * t.alpha
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

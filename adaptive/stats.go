package adaptive

import (
	"hash/maphash"
	"math/bits"
	"strconv"
	"sync"
)

// Mode is how a key's calls run.
type Mode int

const (
	// Optimistic: fn runs without a lock, and commits only if the key's
	// version did not move (package optimistic's Guard). Every key starts
	// here.
	Optimistic Mode = iota
	// Pessimistic: fn runs after the key's row is locked, by the statement
	// that moves its version.
	Pessimistic
)

// String returns "optimistic" or "pessimistic".
func (m Mode) String() string {
	switch m {
	case Optimistic:
		return "optimistic"
	case Pessimistic:
		return "pessimistic"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// table keeps each key's conflict rate and mode in a fixed number of slots,
// direct-mapped by a hash of the key: memory stays bounded whatever the keys,
// and a lookup is one hash and one uncontended-in-the-common-case mutex. A
// collision evicts: the newcomer starts over, optimistic. An LRU would keep a
// hot key against a stream of cold ones, but its list is one more shared
// structure every call would write to.
type table struct {
	seed         maphash.Seed
	mask         uint64
	slots        []slot
	alpha        float64 // weight of a new sample: 1/Window
	enter, leave float64
	dwell        int // samples a key stays in a mode before it may leave it
}

// A slot is one key's state.
type slot struct {
	mu    sync.Mutex // protects the fields below
	hash  uint64     // the key's; 0 marks an empty slot
	mode  Mode
	rate  float64 // conflicts per sample, averaged over about 1/alpha samples
	since int     // samples since the key entered mode
}

func newTable(c Config) *table {
	n := uint64(1) << bits.Len(uint(c.Keys-1))
	return &table{
		seed:  maphash.MakeSeed(),
		mask:  n - 1,
		slots: make([]slot, n),
		alpha: 1 / float64(c.Window),
		enter: c.Enter,
		leave: c.Leave,
		dwell: (c.Window + 1) / 2,
	}
}

func (t *table) hash(key string) uint64 {
	h := maphash.String(t.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// mode returns key's mode.
func (t *table) mode(key string) Mode {
	h := t.hash(key)
	s := &t.slots[h&t.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hash != h {
		return Optimistic
	}
	return s.mode
}

// record adds samples observations made in mode, conflicts of them
// conflicts, to key's rate, moves key to the other mode when the rate
// crossed its threshold, and returns key's mode. Observations of the mode the key is no longer in
// (calls that began before it changed) still count: they measured the key.
func (t *table) record(key string, samples, conflicts int) Mode {
	h := t.hash(key)
	s := &t.slots[h&t.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hash != h {
		s.hash, s.mode, s.rate, s.since = h, Optimistic, 0, 0
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
		return s.mode
	}
	switch {
	case s.mode == Optimistic && s.rate >= t.enter:
		s.mode, s.since = Pessimistic, 0
	case s.mode == Pessimistic && s.rate <= t.leave:
		s.mode, s.since = Optimistic, 0
	}
	return s.mode
}

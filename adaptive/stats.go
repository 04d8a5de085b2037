package adaptive

import (
	"strconv"

	"github.com/contend/contend/internal/keyrate"
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

// table is a Guard's per-key rates (see the package doc for what a
// sample is): a hot key runs locked.
type table struct{ rates *keyrate.Table }

func newTable(c Config) *table {
	return &table{keyrate.New(keyrate.Config{Window: window, Enter: enter, Leave: leave, Keys: c.Keys})}
}

func modeOf(hot bool) Mode {
	if hot {
		return Pessimistic
	}
	return Optimistic
}

// mode returns key's mode.
func (t *table) mode(key string) Mode { return modeOf(t.rates.Hot(key)) }

// record adds samples observations, conflicts of them conflicts, to key's
// rate, and returns key's mode after them.
func (t *table) record(key string, samples, conflicts int) Mode {
	return modeOf(t.rates.Record(key, samples, conflicts))
}

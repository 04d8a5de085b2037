package adaptive

import (
	"fmt"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
)

// Config names the table and columns a [Guard] works on. Names are
// validated and quoted at construction; keys are only ever bind parameters.
// The zero value of every field but Table is its default. When a key changes
// mode is the Guard's own decision (see the package doc); of what a user
// would tune, there are only Keys and NoLocalQueue.
type Config struct {
	// Table holds one row per key, with the key and version columns. It may
	// be schema-qualified ("app.stock"). Required.
	Table string
	// KeyColumn identifies the row. Default: "id".
	KeyColumn string
	// VersionColumn is an integer column (bigint is best), not NULL, that
	// every write for a key moves: the optimistic path checks and bumps it,
	// the locked path bumps it. Default: "version".
	VersionColumn string
	// Retry bounds how often Do runs fn again after a lost race or a
	// deadlock, and how long it waits in between. Default: contend.Retry's
	// defaults.
	Retry contend.Retry
	// Keys is how many keys' recent conflicts a Guard remembers (rounded up
	// to a power of two): a key it does not remember runs optimistic until
	// its conflicts send it under the lock again (see the package doc).
	// Raise it when many more keys than this are busy at once. Default:
	// 4096.
	Keys int
	// FinishTimeout bounds the wait for the COMMIT or ROLLBACK of a
	// transaction the Guard owns, as optimistic.Config.FinishTimeout does.
	// Default: 5s.
	FinishTimeout time.Duration
	// NoLocalQueue turns off the queue in front of the locked path's row
	// lock, as pessimistic.LockerConfig.NoLocalQueue does for a Locker: with it
	// on (the default), the locked calls of one Guard for the same key
	// queue in this process, holding nothing, and only the one holding
	// the lock and the next hold a connection. Turn it off when turns on
	// a hot key should go to processes in proportion to their callers.
	// Default: false, on.
	NoLocalQueue bool
	// Observer, when set, hears both paths: optimistic calls report as
	// package optimistic's guard does (strategy "optimistic"); locked calls
	// report, as strategy "adaptive", Obtained when they hold the lock,
	// Released when their transaction ends, GaveUp when ctx ended while
	// they waited for it, and Failed for any other error. A call whose key
	// went under the lock while it waited for a connection or was
	// retrying optimistically reports an optimistic Released with an error
	// saying so, then goes on locked.
	// Default: nil, no events.
	Observer contend.Observer
}

// The defaults of [Config]'s fields, which their docs state.
const (
	defaultKeyColumn     = "id"
	defaultVersionColumn = "version"
	defaultKeys          = 4096
)

// When a key changes mode (see the package doc): fixed, not settings. A
// key's conflict rate averages over about window samples; it goes under
// the lock at enter and back at leave. 0.2 against 0.05 is a gap of four
// times, wide enough that a key near one of them does not flap, and a
// window of 32 moves a key that moved before within a few dozen calls,
// which a hot key makes in milliseconds; a new key, whose rate is the mean
// of the samples it has, moves at its first lost races.
//
// How long fn holds is not in the rule. A conflict in optimistic mode
// wastes one run of fn, holding a pooled connection; a wait in locked mode
// lasts the holds ahead of it, in the queue holding nothing: both grow with
// the hold, so the conflict rate alone says which mode wastes more. What
// does not grow with it, optimistic mode's one statement more, favours the
// lock at any rate, and is the price of not holding the row while fn runs
// (see "When to choose it" in the package doc).
const (
	window = 32
	enter  = 0.2
	leave  = 0.05
)

// withDefaults returns c with its defaults filled in, validated.
func (c Config) withDefaults() (Config, error) {
	if c.KeyColumn == "" {
		c.KeyColumn = defaultKeyColumn
	}
	if c.VersionColumn == "" {
		c.VersionColumn = defaultVersionColumn
	}
	if c.Keys == 0 {
		c.Keys = defaultKeys
	}
	switch {
	case c.Keys < 1:
		return c, fmt.Errorf("adaptive: keys %d is not positive: %w", c.Keys, contend.ErrInvalid)
	case c.FinishTimeout < 0:
		return c, fmt.Errorf("adaptive: finish timeout %v is negative: %w", c.FinishTimeout, contend.ErrInvalid)
	case c.KeyColumn == c.VersionColumn:
		return c, fmt.Errorf("adaptive: key and version are both column %q: %w", c.KeyColumn, contend.ErrInvalid)
	}
	return c, nil
}

// names is a Config's identifiers, quoted for the server of a dialect.
type names struct {
	table, key, version string
}

func (c Config) names(d sqldb.Dialect) (names, error) {
	var n names
	var err error
	if n.table, err = sqlident.QuoteIn(d, "adaptive: table", c.Table); err != nil {
		return names{}, err
	}
	if n.key, err = sqlident.QuoteIn(d, "adaptive: key column", c.KeyColumn); err != nil {
		return names{}, err
	}
	if n.version, err = sqlident.QuoteIn(d, "adaptive: version column", c.VersionColumn); err != nil {
		return names{}, err
	}
	return n, nil
}

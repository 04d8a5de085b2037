package distlock

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/ctxerr"
)

// Config configures a [Client]. The zero value is ready to use: every field
// has a documented default.
type Config struct {
	// Prefix is put before every key and channel the client makes, so that
	// locks of different applications sharing a Redis cannot collide.
	// Zero means "distlock:".
	Prefix string
	// TTL is the lease of a lock that [Client.Do] takes; Do refreshes it
	// every TTL/3 while fn runs. A holder that crashes blocks the key for at
	// most this long. Redis counts in milliseconds: it is truncated to one.
	// Zero means 10s; at least [MinTTL].
	TTL time.Duration
	// NoWait makes [Client.Do] give up at once, with an error matching
	// [contend.ErrConflict], when the key is held, as a cron job that only
	// one instance must run wants. False (the default): Do waits for the
	// lock.
	NoWait bool
	// MaxWait bounds every wait for a held key (Obtain, and Do without
	// NoWait) when ctx allows longer, so that a stuck holder cannot make
	// callers without a deadline wait forever. Zero means 30s.
	MaxWait time.Duration
	// Recheck is how often a waiter checks the lock by itself, in case the
	// message that tells it its turn came was lost (a dropped subscription)
	// or the holder died without releasing. It also renews the waiter's place
	// in the queue, which lapses after three Rechecks without one (the
	// waiter's process died). Zero means 500ms; at least 1ms.
	Recheck time.Duration
	// GrantLease is how long another process's release reserves the lock
	// for one of this client's waiters, until the waiter's next attempt,
	// sent when the release's message arrives, makes it a hold for its TTL;
	// a hand-over within this client is for the waiter's TTL at once.
	// It is short so that a waiter whose process died blocks the key only
	// briefly; longer than Recheck so that a waiter whose message was lost
	// finds the reservation still there when it checks. Zero means 2 ×
	// Recheck; at least 1ms, and never more than the waiter's TTL.
	GrantLease time.Duration
	// Backoff paces a waiter's checks while the client cannot receive
	// grants (its subscription is down): jittered exponential backoff,
	// capped at Recheck. Its MaxAttempts is ignored: waits end with ctx or
	// MaxWait. Zero means contend.Retry's defaults; MaxDelay at most Recheck.
	Backoff contend.Retry
	// Observer, when set, hears what the client's locks do: obtains with
	// their wait, attempts and fencing token, keys found held, waits given
	// up, refreshes and releases that failed, holds released or lost with
	// how long they lasted ([contend.EventKind] lists when each is
	// reported). It runs on the caller's or the watchdog's goroutine and
	// must not block. Nil (the default): no events, at no cost.
	Observer contend.Observer
}

// The defaults of a zero field of [Config] or [QuorumConfig], as their docs
// state.
const (
	defaultPrefix      = "distlock:"
	defaultTTL         = 10 * time.Second
	defaultMaxWait     = 30 * time.Second
	defaultRecheck     = 500 * time.Millisecond
	defaultNodeTimeout = 50 * time.Millisecond
	defaultDriftFactor = 0.01
)

// MinTTL is the shortest lease accepted. The watchdog refreshes every TTL/3,
// and each refresh is a round trip to Redis that must fit in that interval
// with room to retry.
const MinTTL = 10 * time.Millisecond

// releaseTimeout bounds the clean-up calls (release, leaving the queue) that
// must happen even when the caller's ctx has already ended.
const releaseTimeout = 5 * time.Second

// A releaseClock gives clean-up calls that must run even when the
// caller's ctx has ended (a release, a waiter leaving the queue) a context
// of their own that ends releaseTimeout later, give or take a tick: the
// calls of one tick share one deadline context, and its timer. A timer per
// release would cost more than the release: a timer due before every other
// one makes the runtime wake a thread to watch it. The zero value is ready.
type releaseClock struct {
	mu   sync.Mutex      // protects the fields below
	at   time.Time       // tick's deadline
	tick context.Context // ends at at
	// stop is tick's cancel, never called: its deadline's timer frees it.
	stop context.CancelFunc
}

// releaseTick is how much later than releaseTimeout a clean-up call may end.
const releaseTick = 50 * time.Millisecond

// context returns ctx's values, without its cancellation, ending
// releaseTimeout from now, rounded up to the next tick.
func (rc *releaseClock) context(ctx context.Context) context.Context {
	at := time.Now().Add(releaseTimeout + releaseTick).Truncate(releaseTick)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !at.Equal(rc.at) {
		rc.at = at
		rc.tick, rc.stop = context.WithDeadline(context.Background(), at)
	}
	return releaseContext{Context: rc.tick, values: ctx}
}

// A releaseContext is a tick's deadline, on a caller's values.
type releaseContext struct {
	context.Context                 // the tick's: Deadline, Done and Err
	values          context.Context // the caller's ctx, asked for its values only
}

// Value looks in the tick first, which has no values but its cancellation
// (found by context.Cause, and by the contexts derived from this one, which
// it then ends without a goroutine each), then in the caller's ctx: the
// tick answers for the cancellation, so the caller's is never seen.
func (c releaseContext) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// healthInterval is how long the subscription may stay silent before it is
// pinged, so that a connection that died without a reset is noticed.
const healthInterval = 5 * time.Second

// errMaxWait is the cause of a wait cut short by Config.MaxWait.
var errMaxWait = fmt.Errorf("distlock: waited Config.MaxWait: %w", context.DeadlineExceeded)

func (cfg Config) withDefaults() (Config, error) {
	err := common("Config", &cfg.Prefix, &cfg.TTL, &cfg.MaxWait, map[string]time.Duration{
		"Recheck": cfg.Recheck, "GrantLease": cfg.GrantLease,
	})
	if err != nil {
		return cfg, err
	}
	cfg.Recheck = cmp.Or(cfg.Recheck, defaultRecheck)
	cfg.GrantLease = cmp.Or(cfg.GrantLease, 2*cfg.Recheck)
	for name, d := range map[string]time.Duration{"Recheck": cfg.Recheck, "GrantLease": cfg.GrantLease} {
		if d < time.Millisecond {
			return cfg, fmt.Errorf("distlock: Config.%s %v is below 1ms: %w", name, d, contend.ErrInvalid)
		}
	}
	if cfg.Backoff.MaxDelay <= 0 || cfg.Backoff.MaxDelay > cfg.Recheck {
		cfg.Backoff.MaxDelay = min(500*time.Millisecond, cfg.Recheck) // contend.Retry's default MaxDelay
	}
	return cfg, nil
}

// MaxDuration bounds every duration of a [Config] or [QuorumConfig] and
// every lease asked for: a year. Past it, the deadlines and leases made
// from them (three Rechecks, a deadline MaxWait from now) could overflow.
const MaxDuration = 365 * 24 * time.Hour

// common checks and fills in the fields that Config and QuorumConfig (what)
// share, and refuses a negative or too large value of the others.
func common(what string, prefix *string, ttl, maxWait *time.Duration, others map[string]time.Duration) error {
	others["TTL"], others["MaxWait"] = *ttl, *maxWait
	for name, d := range others {
		if d < 0 || d > MaxDuration {
			return fmt.Errorf("distlock: %s.%s %v is negative or above MaxDuration: %w", what, name, d, contend.ErrInvalid)
		}
	}
	*prefix, *ttl, *maxWait = cmp.Or(*prefix, defaultPrefix), cmp.Or(*ttl, defaultTTL), cmp.Or(*maxWait, defaultMaxWait)
	if strings.ContainsAny(*prefix, "{}") {
		// A '{' there would make the prefix, not the key, the hash tag of
		// every lock, and put them all on one Cluster slot.
		return fmt.Errorf("distlock: %s.Prefix %q: a prefix may not contain '{' or '}', which would put every lock on one Cluster slot: %w", what, *prefix, contend.ErrInvalid)
	}
	return checkTTL(what+".TTL", *ttl)
}

func checkTTL(what string, ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxDuration {
		return fmt.Errorf("distlock: %s %v is outside [%v, %v]: %w", what, ttl, MinTTL, MaxDuration, contend.ErrInvalid)
	}
	return nil
}

// checkObtain checks an obtain's arguments and ctx, and returns ttl in
// whole milliseconds, as Redis counts. It refuses an empty key, and one
// with a '}': the lock's keys are Prefix + "{" + key + "}" and suffixes,
// and Redis Cluster hashes only what lies between the first '{' and the
// first '}' after it. A '}' in key would end that early: a key that starts
// with one leaves the tag empty and the lock's keys on different slots,
// where no script can touch them together.
func checkObtain(ctx context.Context, key string, ttl time.Duration) (time.Duration, error) {
	switch {
	case key == "":
		return 0, fmt.Errorf("distlock: obtain: empty key: %w", contend.ErrInvalid)
	case strings.ContainsRune(key, '}'):
		return 0, fmt.Errorf("distlock: obtain %q: a key may not contain '}', which ends its Cluster hash tag: %w", key, contend.ErrInvalid)
	}
	if err := checkTTL("ttl", ttl); err != nil {
		return 0, err
	}
	if err := ctxerr.Of(ctx); err != nil {
		return 0, fmt.Errorf("distlock: obtain %q: %w", key, err)
	}
	return ttl.Truncate(time.Millisecond), nil
}

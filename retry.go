package contend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Retry says how often an operation that lost a race is tried again and how
// long to wait in between. The zero value is ready to use: every field has a
// documented default. Waits use "full jitter" (a uniformly random delay between
// zero and an exponentially growing cap): losers of one race that retried after
// the same fixed delay would collide again, while jitter spreads them out.
//
// A Retry is a value; it is safe for simultaneous use by multiple goroutines.
type Retry struct {
	// MaxAttempts is how many times the operation runs at most, the first
	// included. Default: 10.
	MaxAttempts int
	// BaseDelay caps the wait after the first failed attempt; the cap doubles
	// with each attempt after that. Default: 2ms.
	BaseDelay time.Duration
	// MaxDelay is the largest cap a wait can reach. Default: 500ms.
	MaxDelay time.Duration
}

// The defaults of [Retry]'s fields, which their docs state.
const (
	defaultMaxAttempts = 10
	defaultBaseDelay   = 2 * time.Millisecond
	defaultMaxDelay    = 500 * time.Millisecond
)

func (r Retry) withDefaults() Retry {
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = defaultMaxAttempts
	}
	if r.BaseDelay <= 0 {
		r.BaseDelay = defaultBaseDelay
	}
	if r.MaxDelay <= 0 {
		r.MaxDelay = defaultMaxDelay
	}
	if r.MaxDelay < r.BaseDelay {
		r.MaxDelay = r.BaseDelay
	}
	return r
}

// Attempts returns the number of attempts r allows, defaults applied.
func (r Retry) Attempts() int { return r.withDefaults().MaxAttempts }

// Delay returns the wait before attempt+1, where attempt counts the attempts
// made so far (1 after the first one failed): a random duration in
// [0, min(MaxDelay, BaseDelay·2^(attempt-1))].
func (r Retry) Delay(attempt int) time.Duration {
	r = r.withDefaults()
	limit := r.MaxDelay
	if attempt < 1 {
		attempt = 1
	}
	if shift := attempt - 1; shift < 62 {
		if d := r.BaseDelay << shift; d > 0 && d < limit {
			limit = d
		}
	}
	return rand.N(limit + 1)
}

// Wait sleeps for [Retry.Delay](attempt), or until ctx ends, in which case it
// returns ctx's error.
func (r Retry) Wait(ctx context.Context, attempt int) error {
	t := time.NewTimer(r.Delay(attempt))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Do runs op until it succeeds, returns an error that retryable rejects, or
// MaxAttempts runs have failed; it waits [Retry.Delay] between runs. It
// returns how many runs it made and the last run's error. When ctx ends first,
// the error wraps both ctx's error and the last run's error. A nil retryable
// retries every error.
func (r Retry) Do(ctx context.Context, op func(ctx context.Context) error, retryable func(error) bool) (attempts int, err error) {
	r = r.withDefaults()
	for attempts = 1; ; attempts++ {
		if cerr := context.Cause(ctx); cerr != nil {
			if err == nil {
				return attempts - 1, cerr
			}
			return attempts - 1, fmt.Errorf("%w (after %d attempts: %w)", cerr, attempts-1, err)
		}
		err = op(ctx)
		if err == nil || (retryable != nil && !retryable(err)) || attempts >= r.MaxAttempts {
			return attempts, err
		}
		if werr := r.Wait(ctx, attempts); werr != nil {
			return attempts, fmt.Errorf("%w (after %d attempts: %w)", werr, attempts, err)
		}
	}
}

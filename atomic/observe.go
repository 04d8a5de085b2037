package atomic

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contend/contend"
)

// What a Claimer reports, and when, is listed at ClaimerConfig.Observer.
// Every report is behind a nil check of the Observer: without one, no event
// is built and no clock is read for it.

// strategy is the Strategy of atomic's events.
const strategy = contend.StrategyAtomic

// maxTracked bounds how many claims made by Claim and ClaimAs a Claimer
// remembers the time of, for the Hold of their Release. Claims never
// released (left to their lease) would otherwise grow the map forever; past
// the bound a Release reports Hold 0.
const maxTracked = 1 << 14

// held is what the report of a hold's end needs: when its claim was made
// and how long making it took. Zero when unknown.
type held struct {
	at   time.Time
	wait time.Duration
}

// claims remembers when the claims of Claim and ClaimAs were made, so that
// the Release that ends one can report its Hold. Do keeps its own.
type claims struct {
	mu sync.Mutex
	at map[claimID]held // protected by mu
}

type claimID struct{ key, token string }

func (c *claims) made(key, token string, at time.Time, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = make(map[claimID]held)
	}
	if len(c.at) < maxTracked {
		c.at[claimID{key, token}] = held{at: at, wait: wait}
	}
}

// get returns what is known of the claim of key with token, and forgets it
// if forget is set.
func (c *claims) get(key, token string, forget bool) held {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := claimID{key, token}
	h := c.at[id]
	if forget {
		delete(c.at, id)
	}
	return h
}

// reportClaim reports the claim of key that began at began and returned
// err, and returns when it ended: the start of the hold if it was made.
func (c *Claimer) reportClaim(ctx context.Context, key string, began time.Time, err error) time.Time {
	now := time.Now()
	e := contend.Event{Strategy: strategy, Key: key, Wait: now.Sub(began), Attempts: 1, Err: err}
	cerr := context.Cause(ctx)
	switch {
	case err == nil:
		e.Kind = contend.EventObtained
	case errors.Is(err, contend.ErrConflict):
		e.Kind = contend.EventConflict
	case cerr != nil && errors.Is(err, cerr):
		e.Kind = contend.EventGaveUp
	default:
		e.Kind = contend.EventFailed
	}
	c.observer.Observe(ctx, e)
	return now
}

// reportEnd reports the end of hold h of key: Lost when the claim was found
// gone (lost), else Failed when the release statement erred (releaseErr),
// else Released with fn's error.
func (c *Claimer) reportEnd(ctx context.Context, key string, h held, releaseErr, lost, fnErr error) {
	e := contend.Event{Strategy: strategy, Key: key, Wait: h.wait, Attempts: 1}
	switch {
	case lost != nil:
		e.Kind, e.Err = contend.EventLost, lost
	case releaseErr != nil:
		e.Kind, e.Err = contend.EventFailed, releaseErr
	default:
		e.Kind, e.Err = contend.EventReleased, fnErr
	}
	if e.Kind != contend.EventFailed && !h.at.IsZero() {
		e.Hold = time.Since(h.at)
	}
	c.observer.Observe(ctx, e)
}

// reportFailed reports a statement of key's hold that erred.
func (c *Claimer) reportFailed(ctx context.Context, key string, err error) {
	c.observer.Observe(ctx, contend.Event{Kind: contend.EventFailed, Strategy: strategy, Key: key, Attempts: 1, Err: err})
}

// gone is the error of a release or extension that found the claim gone.
func gone(key string) error {
	return fmt.Errorf("atomic: claim %q was gone: %w", key, contend.ErrLockLost)
}

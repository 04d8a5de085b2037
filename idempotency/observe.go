package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/contend/contend"
)

// What a call reports to Config.Observer, and when, is listed at
// Config.Observer. Every report is behind a nil check: without an Observer
// a call builds no event and reads no clock for one.

const strategy = contend.StrategyIdempotency

// A report follows one call for its Observer; nil when there is none.
type report struct {
	o        contend.Observer
	key      string
	began    time.Time
	took     time.Time // when fn started
	attempts int
	fence    int64
	ran      bool // fn ran: the key was taken
}

func (s *Store) newReport(key string) *report {
	if s.observer == nil {
		return nil
	}
	return &report{o: s.observer, key: key, began: time.Now()}
}

func (r *report) event(ctx context.Context, kind contend.EventKind, err error) {
	e := contend.Event{Kind: kind, Strategy: strategy, Key: r.key, Attempts: max(r.attempts, 1), Fence: r.fence, Err: err}
	if r.ran {
		e.Wait = r.took.Sub(r.began)
		if kind == contend.EventReleased || kind == contend.EventLost {
			e.Hold = time.Since(r.took)
		}
	} else {
		e.Wait = time.Since(r.began)
	}
	r.o.Observe(ctx, e)
}

// obtained reports that the call took the key and runs fn.
func (r *report) obtained(ctx context.Context, fence int64) {
	if r == nil {
		return
	}
	r.attempts++
	r.ran, r.took, r.fence = true, time.Now(), fence
	r.event(ctx, contend.EventObtained, nil)
}

// answered reports a call that found a live record and did not run fn.
func (r *report) answered(ctx context.Context, replayed bool, err error) {
	if r == nil {
		return
	}
	r.ran = false
	switch {
	case replayed:
		r.event(ctx, contend.EventConflict, ErrReplayed)
	case errors.Is(err, ErrInFlight):
		r.event(ctx, contend.EventConflict, err)
	default:
		r.event(ctx, contend.EventFailed, err)
	}
}

// released reports a stored answer; ferr is fn's final error.
func (r *report) released(ctx context.Context, ferr error) {
	if r == nil {
		return
	}
	r.event(ctx, contend.EventReleased, ferr)
}

// failed reports a database error before the key was had.
func (r *report) failed(ctx context.Context, err error) {
	if r == nil {
		return
	}
	r.event(ctx, contend.EventFailed, err)
}

// ended reports a call that ended with err without storing an answer.
func (r *report) ended(ctx context.Context, err error) {
	if r == nil {
		return
	}
	switch {
	case errors.Is(err, ErrFenced):
		r.event(ctx, contend.EventLost, err)
	case r.ran:
		// fn ran and its error rolled everything back.
		r.event(ctx, contend.EventReleased, err)
	case context.Cause(ctx) != nil:
		r.event(ctx, contend.EventGaveUp, err)
	case errors.Is(err, ErrInFlight):
		r.event(ctx, contend.EventConflict, err)
	default:
		r.event(ctx, contend.EventFailed, err)
	}
}

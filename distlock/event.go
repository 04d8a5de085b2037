package distlock

import (
	"context"
	"time"

	"github.com/contend/contend"
)

// What a Client or Quorum reports to Config.Observer, and when, is listed at
// [contend.EventKind]. Every report is behind a nil check of the Observer:
// without one, no event is built and no clock is read for it.

// strategy is the Strategy of distlock's events.
const strategy = contend.StrategyDistlock

// holdReport is what a Lock keeps, when its owner has an Observer, to
// report the end of its hold.
type holdReport struct {
	at       time.Time     // when the lock was obtained, by this process's clock
	wait     time.Duration // how long obtaining it took
	attempts int
}

// reportObtained reports that l was obtained by a call that began at began
// and made attempts, and keeps what the report of its hold's end needs.
func (l *Lock) reportObtained(ctx context.Context, began time.Time, attempts int) {
	if l.base.observer == nil {
		return
	}
	now := time.Now()
	l.report = holdReport{at: now, wait: now.Sub(began), attempts: attempts}
	l.reportHold(ctx, contend.EventObtained, nil)
}

// reportHold reports an event of l's hold: its start (obtained), its end
// (released or lost), or a failure (Err) while it lasts.
func (l *Lock) reportHold(ctx context.Context, kind contend.EventKind, err error) {
	o := l.base.observer
	if o == nil {
		return
	}
	e := contend.Event{
		Kind: kind, Strategy: strategy, Key: l.key,
		Wait: l.report.wait, Attempts: l.report.attempts, Fence: l.fence, Err: err,
	}
	if kind == contend.EventReleased || kind == contend.EventLost {
		e.Hold = time.Since(l.report.at)
	}
	o.Observe(ctx, e)
}

// reportMiss reports a call for key that began at began (zero when
// unknown), made attempts, and ended without the lock, returning err: a
// conflict or a wait given up.
func reportMiss(ctx context.Context, o contend.Observer, kind contend.EventKind, key string, began time.Time, attempts int, err error) {
	if o == nil {
		return
	}
	e := contend.Event{Kind: kind, Strategy: strategy, Key: key, Attempts: attempts, Err: err}
	if !began.IsZero() {
		e.Wait = time.Since(began)
	}
	o.Observe(ctx, e)
}

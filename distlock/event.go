package distlock

import (
	"strconv"
	"time"
)

// An EventKind says what an [Event] reports.
type EventKind int

// The events a [Client] or [Quorum] reports through Config.Observe.
const (
	// EventObtained: a lock was obtained. Event.Waited is how long it took,
	// first attempt included; Event.Fence is its fencing token.
	EventObtained EventKind = iota + 1
	// EventBusy: a single attempt found the key held (TryObtain, or Do with
	// FailFast).
	EventBusy
	// EventGaveUp: a wait ended without the lock, because ctx ended, MaxWait
	// passed or the client was closed; Event.Err says which.
	EventGaveUp
	// EventRefreshFailed: a refresh did not reach Redis (Event.Err). The
	// lock may still be held; the watchdog tries again while it is valid.
	EventRefreshFailed
	// EventLost: the holder learnt that it no longer holds the lock
	// (Event.Err says how): a refresh found another token or none, its
	// validity passed without a successful refresh, or the release found it
	// gone. Work done under it may have overlapped another holder's.
	EventLost
	// EventReleased: a holder released its lock, or handed it to the next
	// waiter.
	EventReleased
)

func (k EventKind) String() string {
	switch k {
	case EventObtained:
		return "obtained"
	case EventBusy:
		return "busy"
	case EventGaveUp:
		return "gave-up"
	case EventRefreshFailed:
		return "refresh-failed"
	case EventLost:
		return "lost"
	case EventReleased:
		return "released"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// An Event is what the lock reports to Config.Observe: obtain attempts, wait
// times, refresh failures and losses, for metrics and logs.
type Event struct {
	Kind EventKind
	// Key is the caller's key, without the prefix.
	Key string
	// Fence is the lock's fencing token, where one is known (0 in quorum
	// mode).
	Fence int64
	// Waited is how long obtaining took, or how long a wait lasted before
	// giving up.
	Waited time.Duration
	// Err is the reason for EventGaveUp, EventRefreshFailed and EventLost.
	Err error
}

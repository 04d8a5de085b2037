package contend

import (
	"context"
	"strconv"
	"time"
)

// An Observer hears what the guards do: how long callers waited, how long
// they held a key, which races they lost, which holds ended early. Metrics,
// logs and traces are built on it ([SlogObserver] writes events to a
// [log/slog.Logger]).
//
// Every strategy reports the same [Event] through the Observer field of its
// configuration; nil, the default, reports nothing and costs nothing: no
// event is built, no clock is read for it.
//
// Observe gets the context of the call the event belongs to (for a hold that
// ended, the context of the call that held it), so that a tracing adapter
// can parent a span on the caller's and a logger can read request values
// from it; that context may already have ended. Observe runs on the
// caller's goroutine, or on the goroutine of the worker or watchdog that
// saw the event, in the middle of the guard's work: it must be safe for
// simultaneous use, must not block, and must not call back into the guard
// that reported the event.
//
// Observer is an interface, like [net/http.Handler], rather than a func,
// because the adapters worth having carry state (a logger and a level,
// metric instruments, a tracer); [ObserverFunc] adapts a plain function.
type Observer interface {
	// Observe hears one event; see the type doc for when and where it runs.
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// An Event is what a guard reports to its [Observer]: one step of one call
// on one key. Fields that do not apply to the event's kind, or to the
// strategy, are zero.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Strategy is the package that reports. Package redisq reports as
	// [StrategyQueue]; the adaptive guard reports its locked calls as
	// [StrategyAdaptive] and its optimistic ones as [StrategyOptimistic].
	Strategy Strategy
	// Key is the caller's key, as the caller passed it: without a prefix.
	Key string
	// Wait is how long the call took to get the key: from its start until
	// it held the lock, made the claim or started the job, or, for
	// [EventGaveUp], until it stopped trying. Events of a hold carry the wait
	// that began it.
	Wait time.Duration
	// Hold is how long the key was held, or fn or the job ran: set on
	// [EventReleased] and [EventLost].
	Hold time.Duration
	// Attempts counts the tries the call made so far, 1 for the first: lock
	// attempts, transactions, a job's deliveries.
	Attempts int
	// Fence is the fencing token of the hold, where the strategy has one
	// (distlock's [Client]; a redisq partition's lease), else 0.
	Fence int64
	// Err says why, for the kinds that end in failure. For EventConflict
	// and EventGaveUp it is the error the call returns, which matches
	// [ErrConflict] (and ctx's error when ctx ended the wait) unless the
	// guard was closed; for EventLost it matches [ErrLockLost]. On
	// EventReleased it is the error fn returned, if any.
	Err error
}

// A Strategy names the package that reported an [Event]. Its string is the
// package's name, as metrics and logs label it.
type Strategy string

// The strategies that report events.
const (
	StrategyAtomic      Strategy = "atomic"
	StrategyPessimistic Strategy = "pessimistic"
	StrategyOptimistic  Strategy = "optimistic"
	StrategyAdaptive    Strategy = "adaptive"
	StrategyDistlock    Strategy = "distlock"
	StrategyQueue       Strategy = "queue"
	StrategyIdempotency Strategy = "idempotency"
)

// An EventKind says what an [Event] reports. A call that gets its key
// reports EventObtained, then one of EventReleased and EventLost when it
// lets go; a call that does not reports EventConflict or EventGaveUp.
// EventRetry and EventFailed may come in between; EventDeadLettered ends a
// queued job that failed every delivery. EventExpired belongs to no call: a
// cleanup reports it for each record it removes.
//
// What each strategy reports:
//
//	distlock     Obtained (Wait, Attempts, Fence) when a lock is obtained;
//	             Conflict when one attempt (TryObtain, Do with NoWait) finds
//	             the key held; GaveUp when a wait ends with ctx, MaxWait or
//	             Close; Failed when a refresh does not reach Redis (the lock
//	             may still be held) or a release fails; Released (Hold) when
//	             the holder lets go; Lost (Hold) when the watchdog learns the
//	             lock is gone, or the release finds it gone.
//	queue        Failed (Attempts, Err) for each failed delivery of a job;
//	             DeadLettered after its last; GaveUp (Wait) when a caller's
//	             ctx ends while it waits for room in a full partition or for
//	             its job to start (Submit, Do), or for an answer (redisq).
//	             Jobs handled at once report nothing: see Stats. Queue.Do
//	             reports Obtained (Wait) when fn starts and Released (Hold,
//	             fn's error) when it returns. redisq's events carry the
//	             partition lease's Fence, and it passes on its leases' own
//	             events (strategy "distlock", key "partition:N"), all but
//	             conflicts.
//	atomic       a Claimer (Update reports nothing): Obtained (Wait) when a
//	             claim is made; Conflict when the key is claimed already;
//	             GaveUp when ctx ends the claim; Released (Hold, fn's error)
//	             when the claim is cleared; Lost when a release or lease
//	             extension finds it taken over; Failed on a database error.
//	pessimistic  Obtained (Wait, Attempts) when the lock is had; Conflict
//	             when NOWAIT, SKIP LOCKED or a try-lock finds the key held;
//	             Retry on a deadlock or serialization failure run again;
//	             GaveUp on lock_timeout, ctx, or retries run out; Released
//	             (Hold, fn's or the commit's error) when the transaction
//	             ends; Failed on other errors.
//	optimistic   Nothing is locked, so nothing is obtained: Retry for each
//	             attempt lost and made again; Released (Attempts, Hold of
//	             the last attempt, Wait before it) on commit, or with fn's
//	             error; GaveUp when the attempts run out or ctx ends;
//	             Conflict when it ran once in a caller's transaction and
//	             lost; Failed on other errors.
//	idempotency  Obtained (Wait, Fence) when a call takes its key and runs
//	             fn; Released (Hold, fn's final error) when its answer is
//	             stored; Conflict (ErrReplayed) for a replay, with the wait
//	             for a duplicate in flight; Failed for a key used by another
//	             request; Lost when an external call's answer is fenced
//	             out; Expired (Fence) for each record Expire removes.
type EventKind uint8

// The kinds of [Event].
const (
	// EventObtained: the call holds the key: a lock obtained, a claim made,
	// a row locked. Wait is how long that took, Attempts how many tries.
	EventObtained EventKind = iota + 1
	// EventConflict: the call's one attempt found the key held or already
	// claimed, and the call ends at once without it (fail fast); Err
	// matches [ErrConflict]. A lost race that will be tried again is an
	// EventRetry.
	EventConflict
	// EventRetry: an attempt failed in a way worth trying again (a version
	// moved, a deadlock, a serialization failure), and the call will; Err
	// says why, Attempts counts the attempts made.
	EventRetry
	// EventGaveUp: a wait or a retry loop ended without the key, because
	// ctx ended, a maximum wait passed, the attempts ran out or the guard
	// was closed. Wait is how long it tried; Err says why.
	EventGaveUp
	// EventReleased: the holder let the key go (a lock released, a
	// transaction ended, fn returned). Hold is how long it held it.
	EventReleased
	// EventLost: the hold ended before its holder let go (a lease expired,
	// the backend failed): work done under it may have overlapped another
	// holder's. Hold is how long it was held before the loss was seen.
	EventLost
	// EventFailed: a call to the backend, or a job's handler, failed (Err).
	// The call may go on: a refresh is tried again while the lock is valid,
	// a failed job is delivered again unless that was its last delivery.
	EventFailed
	// EventDeadLettered: a queued job failed its last delivery and went to
	// the dead letters (Err is its last error).
	EventDeadLettered
	// EventExpired: a cleanup removed a record whose time was up (an
	// idempotency key past its retention, or an external call's past its
	// lease): the key's next call starts afresh. Fence is the fencing token
	// of the call that took the key last.
	EventExpired
)

var eventKinds = [...]string{
	EventObtained:     "obtained",
	EventConflict:     "conflict",
	EventRetry:        "retry",
	EventGaveUp:       "gave-up",
	EventReleased:     "released",
	EventLost:         "lost",
	EventFailed:       "failed",
	EventDeadLettered: "dead-lettered",
	EventExpired:      "expired",
}

// String returns the kind's name: "obtained", "conflict", "retry",
// "gave-up", "released", "lost", "failed", "dead-lettered" or "expired".
func (k EventKind) String() string {
	if int(k) < len(eventKinds) && eventKinds[k] != "" {
		return eventKinds[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

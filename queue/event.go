package queue

import "strconv"

// An EventKind says what an [Event] reports.
type EventKind int

// The events a [Queue] reports through [Config.Observe]. Jobs that succeed at
// once report nothing: count them with [Queue.Stats].
const (
	// EventFailed: a delivery of a job failed (Event.Err); it will be
	// delivered again unless it was the last.
	EventFailed EventKind = iota + 1
	// EventDeadLettered: a job failed on its last delivery and went to the
	// dead letters (Event.Err is its last error).
	EventDeadLettered
)

func (k EventKind) String() string {
	switch k {
	case EventFailed:
		return "failed"
	case EventDeadLettered:
		return "dead-lettered"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// An Event is what a queue reports to [Config.Observe], for metrics and logs.
type Event struct {
	Kind EventKind
	// Key and Partition say where the job was.
	Key       string
	Partition int
	// Attempt is the delivery the event is about, 1 for the first.
	Attempt int
	// Err is the handler's error (a panic is one, matching [ErrPanic]).
	Err error
}

package queue

import "github.com/contend/contend"

// Promises says what Do promises: fn runs at most once, alone for its key,
// after the jobs and fns queued before it, within this process only.
func (q *Queue) Promises() contend.Promises {
	return contend.Promises{Exclusive: true, AtMostOnce: true, Waits: true}
}

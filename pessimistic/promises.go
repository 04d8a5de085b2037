package pessimistic

import "github.com/contend/contend"

// Promises says what Do promises: fn runs alone for its key, across
// processes, in the guard's transaction; it waits for a held key in [Wait]
// mode. A deadlock or serialization failure runs the transaction again, fn
// included, unless LockerConfig.Retry allows one attempt.
func (l *Locker) Promises() contend.Promises { return l.r.promises() }

// Promises is [Locker.Promises], for the advisory lock.
func (a *Advisory) Promises() contend.Promises { return a.r.promises() }

func (r runner) promises() contend.Promises {
	return contend.Promises{
		Exclusive:       true,
		AtMostOnce:      r.opts.Retry.Attempts() == 1,
		Waits:           r.mode == Wait,
		AcrossProcesses: true,
		InTransaction:   true,
	}
}

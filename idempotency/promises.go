package idempotency

import "github.com/contend/contend"

// Promises says what [Store.Do] promises, as the guards of this module say
// theirs: one fn per key at a time, across processes, in the store's
// transaction; a duplicate in flight is waited for unless
// [Config.NoWait]. fn runs more than once per Do only when a deadlock or
// serialization failure runs the transaction again, unless Config.Retry
// allows one attempt. See [Store.ExternalPromises] for [Store.DoExternal].
func (s *Store) Promises() contend.Promises {
	return contend.Promises{
		Exclusive:       true,
		AtMostOnce:      s.opts.Retry.Attempts() == 1,
		Waits:           !s.noWait,
		AcrossProcesses: true,
		InTransaction:   true,
	}
}

// ExternalPromises says what [Store.DoExternal] promises, as a lease-based
// lock says it: fn runs at most once per call, alone for its key while the
// lease ([Config.Lease]) lasts, across processes; a duplicate in flight is
// waited for unless [Config.NoWait]. fn runs outside any transaction: its
// database work, if any, commits on its own, and an effect of a call whose
// lease ended may be repeated by the next (see DoExternal).
func (s *Store) ExternalPromises() contend.Promises {
	return contend.Promises{
		Exclusive:       true,
		AtMostOnce:      true,
		Waits:           !s.noWait,
		AcrossProcesses: true,
	}
}

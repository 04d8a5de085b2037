package idempotency

import "github.com/contend/contend"

// Promises says what [Store.Do] promises, as the guards of this module say
// theirs: one fn per key at a time, across processes, in the store's
// transaction; a duplicate in flight is waited for unless
// [Config.NoWait]. fn runs more than once per Do only when a deadlock or
// serialization failure runs the transaction again, unless Config.Retry
// allows one attempt. ([Store.DoExternal] keeps fn alone only while its
// lease holds, and outside any transaction.)
func (s *Store) Promises() contend.Promises {
	return contend.Promises{
		Exclusive:       true,
		AtMostOnce:      s.opts.Retry.Attempts() == 1,
		Waits:           !s.noWait,
		AcrossProcesses: true,
		InTransaction:   true,
	}
}

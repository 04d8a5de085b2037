package optimistic

import "github.com/contend/contend"

// Promises says what Do promises: fn runs in the guard's transaction, whose
// commit is the one of a version, across processes; fns for one key overlap
// and the losers run again, so fn may run more than once.
func (g *Guard) Promises() contend.Promises {
	return contend.Promises{Waits: true, AcrossProcesses: true, InTransaction: true}
}

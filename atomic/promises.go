package atomic

import "github.com/contend/contend"

// Promises says what Do promises: fn runs at most once, alone for its key,
// across processes; a held key fails at once. fn runs outside any
// transaction, unless the Claimer was built on one or ctx carries a SQL
// guard's.
func (c *Claimer) Promises() contend.Promises {
	return contend.Promises{Exclusive: true, AtMostOnce: true, AcrossProcesses: true, InTransaction: c.onTx}
}

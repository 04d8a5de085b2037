package distlock

import "github.com/contend/contend"

// Promises says what Do promises: fn runs at most once, alone for its key
// while the lease lasts, across processes; it waits for a held key unless
// Config.FailFast. fn's database work, if any, is its own transaction.
func (c *Client) Promises() contend.Promises { return lockPromises(c.cfg.FailFast) }

// Promises is [Client.Promises], for QuorumConfig.FailFast.
func (q *Quorum) Promises() contend.Promises { return lockPromises(q.cfg.FailFast) }

func lockPromises(failFast bool) contend.Promises {
	return contend.Promises{Exclusive: true, AtMostOnce: true, Waits: !failFast, AcrossProcesses: true}
}

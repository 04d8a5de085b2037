package distlock

import "github.com/contend/contend"

// Promises says what Do promises: fn runs at most once, alone for its key
// while the lease lasts, across processes; it waits for a held key unless
// Config.NoWait. fn's database work, if any, is its own transaction.
func (c *Client) Promises() contend.Promises { return lockPromises(c.cfg.NoWait) }

// Promises is [Client.Promises], for QuorumConfig.NoWait.
func (q *Quorum) Promises() contend.Promises { return lockPromises(q.cfg.NoWait) }

func lockPromises(noWait bool) contend.Promises {
	return contend.Promises{Exclusive: true, AtMostOnce: true, Waits: !noWait, AcrossProcesses: true}
}

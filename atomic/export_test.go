package atomic

// ReadsSent returns how many reads of hot keys c has sent.
func ReadsSent(c *Claimer) int64 { return c.reads.Sent() }

// ReadCallers returns how many of c's claims of key wait for, send or
// share a read of it.
func ReadCallers(c *Claimer, key string) int { return c.reads.Callers(key) }

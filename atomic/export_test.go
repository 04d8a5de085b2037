package atomic

// HotSent returns how many statements of hot keys c's claims shared.
func HotSent(c *Claimer) int64 { return c.hot.Sent() }

// HotCallers returns how many of c's claims of key wait for, send or share
// a statement of a hot key.
func HotCallers(c *Claimer, key string) int { return c.hot.Callers(key) }

// KeyHot reports whether c's claims of key share their statement.
func KeyHot(c *Claimer, key string) bool { return c.losses.Hot(key) }

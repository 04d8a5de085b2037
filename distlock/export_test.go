package distlock

// Deferred returns how many of c's waiters for key wait behind its head
// there, without being queued in Redis.
func Deferred(c *Client, key string) int {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key]; st != nil {
		return len(st.deferred)
	}
	return 0
}

package keepalive

// Queued is how many holds wait for their next refresh.
func (t *Timers) Queued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue)
}

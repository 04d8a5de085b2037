package pessimistic

// Queued returns how many calls of l wait in its queue for key.
func (l *Locker) Queued(key string) int { return l.r.line.Waiting(key) }

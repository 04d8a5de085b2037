package scriptbatch

// Pending returns how many calls are made and not yet answered.
func (s *Sender) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending
}

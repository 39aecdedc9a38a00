package checkpoint

// Entries is the length of the queue, for tests of its bound.
func (t *Tracker) Entries() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

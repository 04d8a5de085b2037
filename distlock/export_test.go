package distlock

import (
	"hash/maphash"

	"github.com/contend/contend/internal/scriptbatch"
)

// Deferred returns how many of c's waiters for key wait behind its head
// there, without being queued in Redis.
func Deferred(c *Client, key string) int {
	sh := &c.local[maphash.String(seed, key)%localShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key]; st != nil {
		return len(st.behind)
	}
	return 0
}

// Known returns how many keys c keeps state for.
func Known(c *Client) int {
	n := 0
	for i := range c.local {
		sh := &c.local[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

// Listening reports whether c's subscription is confirmed.
func Listening(c *Client) bool {
	s := c.sub.Load()
	return s != nil && s.healthy.Load()
}

// The scripts a test's go-redis hook may stop.
var (
	ReleaseScript = releaseScript
	PassScript    = passScript
	AcquireScript = acquireScript
	TakeScript    = takeScript

	QuorumLockScript   = quorumLockScript
	QuorumUnlockScript = quorumUnlockScript
)

// FastPath reports whether c sends its calls on the caller's goroutine,
// its Redis client ending them by their ctx's deadline itself.
func FastPath(c *Client) bool { return scriptbatch.HonoursDeadlines(c.rdb) }

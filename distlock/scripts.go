package distlock

import (
	"embed"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts run the check and the write of each step as one atomic unit on
// the server: a GET followed by a DEL from the client would let a lock that
// expired in between be taken by someone else and then deleted for them.
// Each gives the same answer when the Redis client sends it again after a
// lost reply, as go-redis does after a read timeout.
//
// A Client's scripts are lib.lua (the lock's values and the fencing
// counter), then queue.lua for the two that touch the queue, then their own
// body. Each script's header says what its arguments (ARGV) are; the
// functions below build them, in order.
var (
	//go:embed lua
	lua embed.FS

	takeScript    = script("lib", "take")
	passScript    = script("lib", "pass")
	freeScript    = script("lib", "free")
	refreshScript = script("lib", "refresh")
	pttlScript    = script("lib", "pttl")
	acquireScript = script("lib", "queue", "acquire")
	releaseScript = script("lib", "queue", "release")

	quorumLockScript    = script("quorum_lock")
	quorumUnlockScript  = script("quorum_unlock")
	quorumRefreshScript = script("quorum_refresh")
	quorumPTTLScript    = script("quorum_pttl")
)

// script is the script made of the files lua/NAME.lua, in order.
func script(names ...string) *redis.Script {
	var src []byte
	for _, name := range names {
		b, err := lua.ReadFile("lua/" + name + ".lua")
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		src = append(src, b...)
	}
	return redis.NewScript(string(src))
}

// leaseArgs are the arguments of take.lua, refresh.lua and their quorum
// twins: the token and the lease asked for.
func leaseArgs(token string, ttl time.Duration) []any { return []any{token, ms(ttl)} }

// Replies of free.lua, and held of release.lua.
const (
	replyNotHeld  = 0  // another token took the key since
	replyReleased = 1  // the caller's hold, let go now
	replyGone     = 2  // not held, and nobody took the key since the caller
	replyQueued   = -1 // free.lua: waiters queued, release.lua must run
)

func ms(d time.Duration) int64 { return d.Milliseconds() }

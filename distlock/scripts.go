package distlock

import (
	_ "embed"
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
// body. Each script's arguments are one Go type below, in ARGV's order.
var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/queue.lua
	queueLua string
	//go:embed lua/take.lua
	takeLua string
	//go:embed lua/pass.lua
	passLua string
	//go:embed lua/free.lua
	freeLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/refresh.lua
	refreshLua string
	//go:embed lua/pttl.lua
	pttlLua string
	//go:embed lua/quorum_lock.lua
	quorumLockLua string
	//go:embed lua/quorum_unlock.lua
	quorumUnlockLua string
	//go:embed lua/quorum_refresh.lua
	quorumRefreshLua string
	//go:embed lua/quorum_pttl.lua
	quorumPTTLLua string

	takeScript    = redis.NewScript(libLua + takeLua)
	passScript    = redis.NewScript(libLua + passLua)
	freeScript    = redis.NewScript(libLua + freeLua)
	refreshScript = redis.NewScript(libLua + refreshLua)
	pttlScript    = redis.NewScript(libLua + pttlLua)
	acquireScript = redis.NewScript(libLua + queueLua + acquireLua)
	releaseScript = redis.NewScript(libLua + queueLua + releaseLua)

	quorumLockScript    = redis.NewScript(quorumLockLua)
	quorumUnlockScript  = redis.NewScript(quorumUnlockLua)
	quorumRefreshScript = redis.NewScript(quorumRefreshLua)
	quorumPTTLScript    = redis.NewScript(quorumPTTLLua)
)

// takeArgs are take.lua's and quorum_lock.lua's arguments.
type takeArgs struct {
	token string
	ttl   time.Duration
}

func (a takeArgs) argv() []any { return []any{a.token, ms(a.ttl)} }

// passArgs are pass.lua's arguments: the holder hands the lock to next.
type passArgs struct {
	holder, next string
	nextTTL      time.Duration
}

func (a passArgs) argv() []any { return []any{a.holder, a.next, ms(a.nextTTL)} }

// freeArgs are free.lua's arguments.
type freeArgs struct {
	token string
	fence int64
}

func (a freeArgs) argv() []any { return []any{a.token, a.fence} }

// refreshArgs are refresh.lua's and quorum_refresh.lua's arguments.
type refreshArgs struct {
	token string
	ttl   time.Duration
}

func (a refreshArgs) argv() []any { return []any{a.token, ms(a.ttl)} }

// acquireArgs are acquire.lua's arguments.
type acquireArgs struct {
	token       string
	ttl         time.Duration
	wait        bool   // queue when the key is held; else try once
	channel     string // where a release tells this waiter to look
	waiterLease time.Duration
	grantLease  time.Duration
}

func (a acquireArgs) argv() []any {
	return []any{a.token, ms(a.ttl), flag(a.wait), a.channel, ms(a.waiterLease), ms(a.grantLease)}
}

// releaseArgs are release.lua's arguments.
type releaseArgs struct {
	token       string
	fence       int64 // 0 for a waiter
	givingUp    bool  // a waiter leaves, and may be queued
	channel     string
	waiterLease time.Duration
	// next, if set, is the caller's waiter that the release takes along.
	next *waiter
	// nextInTurn: next is in its client's turn, and a holder hands it the
	// lock without a look at the queue.
	nextInTurn bool
	nextGrant  time.Duration // next's grant lease
}

func (a releaseArgs) argv() []any {
	argv := []any{a.token, a.fence, flag(a.givingUp), a.channel, ms(a.waiterLease)}
	if a.next != nil {
		argv = append(argv, a.next.tok, ms(a.nextGrant), ms(a.next.ttl), flag(a.nextInTurn))
	}
	return argv
}

// Replies of free.lua, and held of release.lua.
const (
	replyNotHeld  = 0  // another token took the key since
	replyReleased = 1  // the caller's hold, let go now
	replyGone     = 2  // not held, and nobody took the key since the caller
	replyQueued   = -1 // free.lua: waiters queued, release.lua must run
)

func ms(d time.Duration) int64 { return d.Milliseconds() }

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

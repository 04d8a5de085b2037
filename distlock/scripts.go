package distlock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The scripts run the check and the write of each step as one atomic unit on
// the server: a GET followed by a DEL from the client would let a lock that
// expired in between be taken by someone else and then deleted for them.
var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/refresh.lua
	refreshLua string
	//go:embed lua/fence.lua
	fenceLua string
	//go:embed lua/take.lua
	takeLua string
	//go:embed lua/free.lua
	freeLua string
	//go:embed lua/pass.lua
	passLua string
	//go:embed lua/pttl.lua
	pttlLua string
	//go:embed lua/lock.lua
	lockLua string
	//go:embed lua/unlock.lua
	unlockLua string

	acquireScript = redis.NewScript(libLua + acquireLua)
	releaseScript = redis.NewScript(libLua + releaseLua)
	fenceScript   = redis.NewScript(libLua + fenceLua)
	takeScript    = redis.NewScript(takeLua)
	freeScript    = redis.NewScript(freeLua)
	passScript    = redis.NewScript(passLua)
	refreshScript = redis.NewScript(libLua + refreshLua)
	pttlScript    = redis.NewScript(libLua + pttlLua)
	lockScript    = redis.NewScript(lockLua)
	unlockScript  = redis.NewScript(unlockLua)
)

-- Shared by every script of a Client: this file, then the script's own
-- body. A lock's keys share one hash tag, so a Cluster keeps them on one
-- slot and one script can touch them all:
--   KEYS[1] the lock; its value is one of
--             T      held by token T
--             T|q    held by T, and a waiter has queued behind it: its
--                    release must run release.lua, which hands it on
--             T|g    reserved for waiter T by a release (a grant): T's
--                    next attempt turns it into a hold (acquire.lua)
--   KEYS[2] the fencing counter
--   KEYS[3] the queue, KEYS[4] the waiters (see queue.lua)
-- Times come from the server's clock only, never from a client's.

-- TIME is non-deterministic; scripts that write after it need effects
-- replication, the default since Redis 5 (SET's GET, below, needs 6.2).

-- fence_idle_ms is how long a fencing counter lives after the last
-- acquisition or refresh of its lock: a day.
local fence_idle_ms = 86400000

-- holds reports whether the lock's value v is a hold of token's, marked or
-- not: the whole value is compared, never a prefix.
local function holds(v, token)
  return v == token or v == token .. '|q'
end

-- fence returns the counter as it stands: the fencing token of the lock's
-- holder, when there is one.
local function fence()
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end

-- next_fence moves the counter for a new holder and returns its value:
-- one more than it was, and never less than the server's clock in
-- microseconds. So a counter that went missing (a new key, one idle past
-- fence_idle_ms, a Redis that lost its data) or went back (a Redis
-- restarted from an older snapshot, a replica that missed increments)
-- still gives a token larger than every one handed out before, as long as
-- that clock did not go back and the key averaged fewer than a million
-- acquisitions a second. All in this one script: a restart done by a
-- second call could be cut off by a crash between the two.
--
-- The clock is almost always ahead of the counter, so the clock is written
-- and the old value read back by one SET ... GET; only a counter that is
-- not behind the clock (two acquisitions within a microsecond, a clock set
-- back) is written a second time, one past where it was.
local function next_fence()
  local t = redis.call('TIME')
  local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', fence_idle_ms, 'GET')
  if last and tonumber(last) >= f then
    f = tonumber(last) + 1
    redis.call('SET', KEYS[2], string.format('%.0f', f), 'PX', fence_idle_ms)
  end
  return f
end

-- released reports what a release of token, holder of fencing token f,
-- that finds the lock not held by token learns: 2 when nobody has taken
-- the key since token did (the counter is still at f), so a release sent
-- again after a lost reply finds its first run's work, and 0 when someone
-- has.
local function released(f)
  if redis.call('GET', KEYS[2]) == f then return 2 end
  return 0
end

-- Shared by acquire.lua, release.lua, fence.lua, refresh.lua and pttl.lua,
-- which are this file followed by their own body. Keys, all under one hash tag so a Cluster keeps them on one
-- slot:
--   KEYS[1] the lock: the holder's token, with the lease as its expiry;
--           followed by '|q' once a waiter has queued behind that holder,
--           so that the release of a lock nobody waits for can be a bare
--           compare-and-delete (free.lua)
--   KEYS[2] the fencing counter: never expires, only ever increases
--   KEYS[3] the queue: a list of waiting tokens, oldest first
--   KEYS[4] the waiters: a hash token -> "deadline_ms grant_ms ttl_ms seq
--           channel", seq numbering the waiter's attempts
-- Times come from the server's clock only, never from a client's.

-- TIME is non-deterministic; scripts that write after it need effects
-- replication, the default since Redis 5 and a no-op to ask for there.
if redis.replicate_commands then redis.replicate_commands() end

-- holds reports whether the lock's value v is token's, marked or not: the
-- whole value is compared, never a prefix.
local function holds(v, token)
  return v == token or v == token .. '|q'
end

-- now_ms is the server's clock in milliseconds, read once per script: a
-- script runs as one step, so one reading serves all of it.
local now
local function now_ms()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

-- next_fence returns the next fencing token. A missing counter (a new key,
-- or a Redis that lost its data in a restart) starts from the server's clock
-- in microseconds rather than from 1, so tokens handed out after the loss
-- are still larger than every token handed out before it, as long as that
-- clock did not go back and fewer than a million locks a second were taken.
local function clock_fence(f)
  local t = redis.call('TIME')
  local c = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
  if f < c then
    redis.call('SET', KEYS[2], string.format('%.0f', c))
    return c
  end
  return f
end

local function next_fence()
  local f = redis.call('INCR', KEYS[2])
  if f == 1 then f = clock_fence(f) end
  return f
end

-- waiter_entry is a waiter's value in KEYS[4]. A deadline in milliseconds
-- prints in full with Lua's %.14g until the year 5138.
local function waiter_entry(deadline, grant_ms, ttl_ms, seq, channel)
  return deadline .. ' ' .. grant_ms .. ' ' .. ttl_ms .. ' ' .. seq .. ' ' .. channel
end

-- dequeue takes waiter t out of line, if it is there.
local function dequeue(t)
  if redis.call('HDEL', KEYS[4], t) == 1 then
    redis.call('LREM', KEYS[3], 1, t)
  end
end

-- enqueue puts waiter t in line with its entry, or renews its place if it
-- is there already; pushes the queue's expiry past its lease, so that an
-- abandoned queue disappears by itself; and marks cur, the lock's value, if
-- it is not marked yet: a lock taken while nobody waited (take.lua) is
-- released with a bare compare-and-delete unless marked.
local function enqueue(t, entry, lease, cur)
  if redis.call('HSET', KEYS[4], t, entry) == 1 then
    redis.call('RPUSH', KEYS[3], t)
  end
  redis.call('PEXPIRE', KEYS[3], lease)
  redis.call('PEXPIRE', KEYS[4], lease)
  if cur and string.sub(cur, -2) ~= '|q' then
    redis.call('SET', KEYS[1], cur .. '|q', 'KEEPTTL')
  end
end

-- grant_message hands the lock to t, the waiter whose attempt seq it
-- answers: the message that tells it, with the next fencing token.
local function grant_message(t, seq)
  return t .. ' ' .. seq .. ' ' .. string.format('%.0f', next_fence())
end

-- grant_next pops waiters, oldest first, skipping those whose process has
-- stopped renewing its place, until it finds a live one. If that one is self,
-- it returns 'self' and the caller takes the lock; otherwise it hands the
-- lock to that waiter's token and tells the waiter's process: the token,
-- the seq of the waiter's latest attempt (so it knows the grant came after
-- that attempt) and the fencing token.
--
-- When the waiter's channel is local_channel (the caller's own process's),
-- the message is the return value: the caller wakes the waiter itself, a
-- hop sooner, and the lock is the waiter's for its full TTL, since the
-- process that receives the reply is alive. Any other waiter is published
-- to, and gets the short grant lease it asked for, which it extends when it
-- accepts: a waiter whose process died holds the key only briefly. It
-- returns false when nobody is waiting, 'granted' when it published.
local function grant_next(self, local_channel)
  while true do
    local t = redis.call('LPOP', KEYS[3])
    if not t then return false end
    local w = redis.call('HGET', KEYS[4], t)
    if w then
      redis.call('HDEL', KEYS[4], t)
      local deadline, grant_ms, ttl_ms, seq, channel = string.match(w, '^(%d+) (%d+) (%d+) (%d+) (.*)$')
      if tonumber(deadline) >= now_ms() then
        if t == self then return 'self' end
        if channel == local_channel then
          redis.call('SET', KEYS[1], t, 'PX', ttl_ms)
          return grant_message(t, seq)
        end
        redis.call('SET', KEYS[1], t, 'PX', grant_ms)
        redis.call('PUBLISH', channel, grant_message(t, seq))
        return 'granted'
      end
    end
  end
end

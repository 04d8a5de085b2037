-- The queue of a lock's waiters, shared by acquire.lua and release.lua
-- (after lib.lua):
--   KEYS[3] the queue: a list of waiting tokens, oldest first
--   KEYS[4] the waiters: a hash token -> "deadline_ms grant_ms ttl_ms
--           channel"; a waiter whose deadline passed without its renewing
--           it (its process died) is skipped
-- Both expire when the lease of the last waiter to renew its place has
-- passed, so an abandoned queue disappears by itself.

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

-- waiter_entry is a waiter's value in KEYS[4]. A deadline in milliseconds
-- prints in full with Lua's %.14g until the year 5138.
local function waiter_entry(deadline, grant_ms, ttl_ms, channel)
  return deadline .. ' ' .. grant_ms .. ' ' .. ttl_ms .. ' ' .. channel
end

-- dequeue takes waiter t out of line, if it is there.
local function dequeue(t)
  if redis.call('HDEL', KEYS[4], t) == 1 then
    redis.call('LREM', KEYS[3], 1, t)
  end
end

-- extend makes key live at least lease ms more, never less: the queue
-- lasts as long as its longest-lived waiter, whose place a waiter with a
-- shorter lease (another client's, with a shorter Recheck) must not cut.
local function extend(key, lease)
  if redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
end

-- enqueue puts waiter t in line with its entry, or renews its place if it
-- is there already; and marks cur, the lock's value, as a hold with waiters
-- behind it, so that its release hands it on (see lib.lua).
local function enqueue(t, entry, lease, cur)
  if redis.call('HSET', KEYS[4], t, entry) == 1 then
    redis.call('RPUSH', KEYS[3], t)
  end
  extend(KEYS[3], lease)
  extend(KEYS[4], lease)
  if cur and string.sub(cur, -2) ~= '|q' and string.sub(cur, -2) ~= '|g' then
    redis.call('SET', KEYS[1], cur .. '|q', 'KEEPTTL')
  end
end

-- grant_next pops waiters, oldest first, skipping those whose process has
-- stopped renewing its place, until it finds a live one, and hands it the
-- lock. It returns false when nobody is waiting, 'self' when that waiter
-- is self (the caller takes the lock itself).
--
-- A waiter whose channel is local_channel (the caller's own process's)
-- holds the lock at once, for its TTL, with the next fencing token: the
-- caller has the reply, which is Redis's word, and wakes the waiter
-- itself; grant_next returns "token fence". Any other waiter gets a
-- reservation for the short grant lease it asked for, and a message on its
-- process's channel that asks it to look: its next attempt turns the
-- reservation into a hold. A message proves nothing by itself (anyone who
-- may PUBLISH can send one), and a waiter whose process died holds the key
-- for the grant lease only. grant_next then returns 'granted'.
local function grant_next(self, local_channel)
  while true do
    local t = redis.call('LPOP', KEYS[3])
    if not t then return false end
    local w = redis.call('HGET', KEYS[4], t)
    if w then
      redis.call('HDEL', KEYS[4], t)
      local deadline, grant_ms, ttl_ms, channel = string.match(w, '^(%d+) (%d+) (%d+) (.*)$')
      if tonumber(deadline) >= now_ms() then
        if t == self then return 'self' end
        if channel == local_channel then
          redis.call('SET', KEYS[1], t, 'PX', ttl_ms)
          return t .. ' ' .. string.format('%.0f', next_fence())
        end
        redis.call('SET', KEYS[1], t .. '|g', 'PX', grant_ms)
        redis.call('PUBLISH', channel, t)
        return 'granted'
      end
    end
  end
end

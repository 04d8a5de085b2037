-- release: a holder lets go, or a waiter gives up; in one step, so that a
-- waiter that was handed the lock while giving up passes it on instead of
-- leaving it held until its lease runs out. The caller's process may send
-- along the first of its waiters that wait behind the caller there, not
-- queued here: it is queued when the lock goes to another process's waiter
-- (or stays someone else's), and is handed the lock when nobody is queued.
--   ARGV[1] token, ARGV[2] its fencing token ('0' for a waiter), ARGV[3]
--   '1' when a waiter gives up (it may be queued), ARGV[4] the caller's
--   channel, ARGV[5] waiter lease ms; then, optionally, the caller's
--   waiter: ARGV[6] its token, ARGV[7] its grant lease ms, ARGV[8] its ttl
--   ms, ARGV[9] '1' when it is in the caller's process's turn: a holder
--   hands it the lock without a look at the queue.
-- Returns {held, grant, turn}: held 1 when the token held the lock, else
-- what released() says; grant "token fence" when a waiter of the caller's
-- own process now holds the lock, which the caller wakes, or ''; turn 1
-- when that was a hand-over in turn.
local token, channel, next = ARGV[1], ARGV[4], ARGV[6]
if ARGV[3] == '1' then dequeue(token) end

-- queue_next queues the caller's waiter behind cur, the lock's value.
local function queue_next(cur)
  if not next then return end
  local lease = tonumber(ARGV[5])
  enqueue(next, waiter_entry(now_ms() + lease, ARGV[7], ARGV[8], channel), lease, cur)
end

-- pass_next hands the lock to the caller's waiter, for its TTL.
local function pass_next(held, turn)
  redis.call('SET', KEYS[1], next, 'PX', ARGV[8])
  return {held, next .. ' ' .. string.format('%.0f', next_fence()), turn}
end

local cur = redis.call('GET', KEYS[1])
if next and holds(cur, next) then
  -- Sent again after a lost reply: the first run handed the lock to next.
  local turn = 0
  if ARGV[9] == '1' then turn = 1 end
  return {1, next .. ' ' .. string.format('%.0f', fence()), turn}
end
local held = 0
if holds(cur, token) or cur == token .. '|g' then
  held = 1
elseif cur then
  queue_next(cur) -- someone else's: their release serves the queue
  return {released(ARGV[2]), '', 0}
else
  held = released(ARGV[2])
end
if held == 1 and next and ARGV[9] == '1' then
  return pass_next(1, 1)
end
-- Ours to hand on, or free (its lease ran out): the oldest live waiter in
-- the queue gets it, else the caller's.
local r = grant_next(false, channel)
if r == 'granted' then
  queue_next(false)
  return {held, '', 0}
elseif r then
  return {held, r, 0}
end
if next then
  return pass_next(held, 0)
end
if held == 1 then redis.call('DEL', KEYS[1]) end
return {held, '', 0}


-- release: a holder lets go, or a waiter gives up; in one step, so a waiter
-- that was granted the lock while giving up passes it on instead of leaving
-- it held until the grant lease runs out. The caller's process may send
-- along the first of its waiters that wait behind the caller there, not
-- queued here: it is queued when the lock goes to another process's waiter
-- (or stays someone else's), and is handed the lock when nobody is queued.
--   ARGV[1] token, ARGV[2] '1' when a waiter gives up (it may be queued),
--   ARGV[3] the caller's grant channel, ARGV[4] waiter lease ms; then,
--   optionally, the caller's waiter: ARGV[5] its token, ARGV[6] its grant
--   lease ms, ARGV[7] its ttl ms, ARGV[8] '1' when it is in the caller's
--   process's turn: a holder hands it the lock without a look at the queue.
-- Returns {held, grant, turn}: held 1 when the token held the lock, else 0;
-- grant the message of a grant to a waiter of the caller's own process,
-- which the caller wakes, or ''; turn 1 when that was a hand-over in turn.
local token, channel, next = ARGV[1], ARGV[3], ARGV[5]
if ARGV[2] == '1' then dequeue(token) end

-- queue_next queues the caller's waiter, as its attempt 1, behind cur, the
-- lock's value (false for a grant's lock, which needs no mark).
local function queue_next(cur)
  if not next then return end
  local lease = tonumber(ARGV[4])
  enqueue(next, waiter_entry(now_ms() + lease, ARGV[6], ARGV[7], 1, channel), lease, cur)
end

-- pass_next hands the lock to the caller's waiter, for its TTL.
local function pass_next(held, turn)
  redis.call('SET', KEYS[1], next, 'PX', ARGV[7])
  return {held, grant_message(next, 1), turn}
end

local cur = redis.call('GET', KEYS[1])
local held = 0
if holds(cur, token) then
  held = 1
elseif cur then
  queue_next(cur) -- someone else's: their release serves the queue
  return {0, '', 0}
end
if held == 1 and next and ARGV[8] == '1' then
  return pass_next(1, 1)
end
-- Ours to hand on, or free (its lease ran out): the oldest live waiter in
-- the queue gets it, else the caller's.
local r = grant_next(false, channel)
if r == 'granted' then
  -- A grant's lock is always released by this script: no mark needed.
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


-- release: a holder lets go, or a waiter gives up; in one step, so a waiter
-- that was granted the lock while giving up passes it on instead of leaving
-- it held until the grant lease runs out.
--   ARGV[1] token, ARGV[2] '1' when a waiter gives up (it may be queued),
--   ARGV[3] the caller's grant channel
-- Returns 0 when the token did not hold the lock, 1 when it was released and
-- is free, 2 when it was handed to the next waiter and published to it, and
-- the grant message when it was handed to a waiter of the caller's own
-- process, which the caller wakes.
local token = ARGV[1]
if ARGV[2] == '1' and redis.call('HDEL', KEYS[4], token) == 1 then
  redis.call('LREM', KEYS[3], 1, token)
end
if redis.call('GET', KEYS[1]) ~= token then return 0 end
local r = grant_next(false, ARGV[3])
if r == 'granted' then return 2 end
if r then return r end
redis.call('DEL', KEYS[1])
return 1


-- release: a holder lets go, or a waiter gives up; in one step, so a waiter
-- that was granted the lock while giving up passes it on instead of leaving
-- it held until the grant lease runs out.
--   ARGV[1] token, ARGV[2] '1' when a waiter gives up (it may be queued)
-- Returns 0 when the token did not hold the lock, 1 when it was released and
-- is free, 2 when it was handed to the next waiter.
local token = ARGV[1]
if ARGV[2] == '1' and redis.call('HDEL', KEYS[4], token) == 1 then
  redis.call('LREM', KEYS[3], 1, token)
end
if redis.call('GET', KEYS[1]) ~= token then return 0 end
if redis.call('LLEN', KEYS[3]) > 0 and grant_next(now_ms(), false) == 'granted' then
  return 2
end
redis.call('DEL', KEYS[1])
return 1

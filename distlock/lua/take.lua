-- take: the common obtain, of a free key: SET NX PX and the next fencing
-- token, no queue.
--   ARGV[1] token, ARGV[2] ttl ms
-- Returns the fencing token when the caller holds the lock, 0 when the key
-- is held. Sent again after a lost reply, it finds its own token, and
-- answers as the first run did.
local token = ARGV[1]
if redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  return next_fence()
end
if holds(redis.call('GET', KEYS[1]), token) then return fence() end
return 0

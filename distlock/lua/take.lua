-- take: the common obtain, of a free key: SET NX PX and the next fencing
-- token; it queues nobody (KEYS[3] is only looked at).
--   ARGV[1] token, ARGV[2] ttl ms
-- Returns the fencing token when the caller holds the lock, 0 when the key
-- is held. Sent again after a lost reply, it finds its own token, and
-- answers as the first run did.
local token = ARGV[1]
if redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  if redis.call('LLEN', KEYS[3]) > 0 then
    -- Waiters are queued (a holder's lease ran out while they waited):
    -- marked, the lock's release hands it to them.
    redis.call('SET', KEYS[1], token .. '|q', 'KEEPTTL')
  end
  return next_fence()
end
if holds(redis.call('GET', KEYS[1]), token) then return fence() end
return 0

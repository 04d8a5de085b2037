-- pass: a holder hands the lock to the next waiter of its own process, in
-- that process's turn (see local.go), without a look at the queue.
--   ARGV[1] the holder's token, ARGV[2] the waiter's token, ARGV[3] its ttl
--   ms
-- Returns the waiter's fencing token, or 0, changing nothing, when the
-- holder no longer holds the lock (release.lua then finds out what became
-- of it). Sent again after a lost reply, it finds the waiter holding.
local v = redis.call('GET', KEYS[1])
if v == ARGV[2] then return fence() end
if not holds(v, ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return next_fence()

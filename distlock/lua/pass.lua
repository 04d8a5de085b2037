-- pass: a holder hands the lock to the next waiter of its own process, in
-- that process's turn (see release.lua), which takes no look at the queue:
-- so it needs neither the queue nor the library, and costs what take.lua
-- does rather than a third of what release.lua does.
--   KEYS[1] the lock, KEYS[2] the fencing counter; ARGV[1] the holder's
--   token, ARGV[2] the waiter's token, ARGV[3] its ttl ms.
-- Returns 0, changing nothing, when the holder's token no longer holds the
-- lock (release.lua then sorts out what became of it); else the waiter's
-- fencing token, where 1 means the counter was missing, and fence.lua
-- restarts it from the clock.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '|q' then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return redis.call('INCR', KEYS[2])

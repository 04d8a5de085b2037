
-- fence: take.lua found the fencing counter missing (its INCR made it 1).
-- Restart the counter from the server's clock, as
-- next_fence does, and return the holder's token: larger than any handed
-- out before.
--   KEYS[1] the lock (unused), KEYS[2] the fencing counter.
return clock_fence(redis.call('INCR', KEYS[2]))

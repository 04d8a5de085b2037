
-- fence: the MULTI that took a free key found its fencing counter missing
-- (its INCR made it 1). Restart the counter from the server's clock, as
-- next_fence does, and return the holder's token: larger than any handed
-- out before, including by failed attempts that moved the counter since.
--   KEYS[1] the lock (unused), KEYS[2] the fencing counter.
return clock_fence(redis.call('INCR', KEYS[2]))

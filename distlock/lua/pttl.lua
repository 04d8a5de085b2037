-- pttl: the lease left, if the caller still holds the lock.
--   ARGV[1] token. Returns -3 when not held, else PTTL.
if not holds(redis.call('GET', KEYS[1]), ARGV[1]) then return -3 end
return redis.call('PTTL', KEYS[1])

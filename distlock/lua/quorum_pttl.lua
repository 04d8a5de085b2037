-- quorum_pttl: the lease a Quorum node has left for the caller's lock.
--   KEYS[1] the lock; ARGV[1] token. Returns -3 when not held, else PTTL.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -3 end
return redis.call('PTTL', KEYS[1])

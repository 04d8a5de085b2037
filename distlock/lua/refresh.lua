-- refresh: extend the lease, only while the whole stored value is the
-- caller's token (marked or not: see lib.lua). An expired lock is not taken
-- again: its holder has been, or will be, told that it lost it.
--   KEYS[1] the lock; ARGV[1] token, ARGV[2] ttl ms. Returns 1 if extended.
if not holds(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1

-- refresh: extend the lease, only while the whole stored value is the
-- caller's hold. An expired lock is not taken again: its holder has been,
-- or will be, told that it lost it. The fencing counter lives on with it.
--   ARGV[1] token, ARGV[2] ttl ms. Returns 1 if extended.
if not holds(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], fence_idle_ms)
return 1

-- quorum_refresh: a Quorum node's refresh, compare-and-PEXPIRE.
--   KEYS[1] the lock; ARGV[1] token, ARGV[2] ttl ms. Returns 1 if extended.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1

-- quorum_lock: SET NX PX on a Quorum node, which keeps no queue or fence.
--   KEYS[1] the lock; ARGV[1] token, ARGV[2] ttl ms. Returns 1 if set, or
--   if it holds the token already: sent again after a lost reply, it finds
--   its first run's work.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0

-- quorum_unlock: compare-and-delete on a Quorum node, which keeps no queue.
--   KEYS[1] the lock; ARGV[1] token. Returns 1 if deleted.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])

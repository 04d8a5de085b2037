-- quorum_unlock: compare-and-delete on a Quorum node, which keeps no queue.
--   KEYS[1] the lock; ARGV[1] token. Returns 1 if deleted, 2 if the key is
--   gone (sent again after a lost reply, or expired: the caller tells which
--   by its validity), 0 if someone else holds it.
local v = redis.call('GET', KEYS[1])
if not v then return 2 end
if v ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])

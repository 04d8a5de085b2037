-- free: compare-and-delete, unless waiters are queued: the release of a
-- lock taken while nobody waited, when still nobody does. Two keys and no
-- library keep it nearly as cheap as a bare release; when it finds waiters,
-- it leaves the lock to release.lua, which hands it over.
--   KEYS[1] the lock, KEYS[2] the queue; ARGV[1] token.
-- Returns 0 when the token did not hold the lock, 1 when it was deleted, -1
-- when waiters are queued and the lock is still held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('DEL', KEYS[1])
return 1

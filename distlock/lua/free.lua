-- free: compare-and-delete, the release of a lock taken while nobody
-- waited, when still nobody does. A waiter that queues behind a lock marks
-- it (see acquire.lua), so this is a bare compare-and-delete: one key, no
-- library. When it finds the lock marked, it leaves it to release.lua, which
-- hands it over.
--   KEYS[1] the lock; ARGV[1] token.
-- Returns 0 when the token did not hold the lock, 1 when it was deleted, -1
-- when waiters are queued and the lock is still held.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v == ARGV[1] .. '|q' then return -1 end
return 0

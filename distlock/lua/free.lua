-- free: compare-and-delete, the release of a lock taken while nobody
-- waited (take.lua), when still nobody does. A waiter that queues behind a
-- lock marks it, and then release.lua must hand it over.
--   ARGV[1] token, ARGV[2] its fencing token
-- Returns 1 when it deleted the lock, -1 when it left a marked lock to
-- release.lua, else what released() says.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v == ARGV[1] .. '|q' then return -1 end
return released(ARGV[2])

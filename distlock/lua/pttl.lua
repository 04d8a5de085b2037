-- pttl: the lease left, if the caller still holds the lock (its token,
-- marked or not: see lib.lua).
--   KEYS[1] the lock; ARGV[1] token. Returns -3 when not held, else PTTL.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] and v ~= ARGV[1] .. '|q' then return -3 end
return redis.call('PTTL', KEYS[1])

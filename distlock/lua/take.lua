-- take: the common obtain, of a free key: SET NX PX and, if it was set, the
-- next fencing token. Two keys and no library keep it nearly as cheap as a
-- bare SET; what a held key needs (the queue) is acquire.lua's.
--   KEYS[1] the lock, KEYS[2] the fencing counter; ARGV[1] token, ARGV[2]
--   ttl ms. Returns 0 when the key is held, else the fencing token; 1 means
--   the counter was missing, and fence.lua restarts it from the clock.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return redis.call('INCR', KEYS[2])


-- acquire: take the lock, or accept a grant, or (when waiting) join or stay
-- in the queue.
--   ARGV[1] token, ARGV[2] ttl ms, ARGV[3] '1' to wait, '0' to try once,
--   ARGV[4] the waiter's channel, ARGV[5] waiter lease ms, ARGV[6] the grant
--   lease ms the waiter asks for, ARGV[7] the number of this attempt
-- Returns {1, fence} when the caller holds the lock, {0, 0} when not.
local token, ttl = ARGV[1], ARGV[2]
local cur = redis.call('GET', KEYS[1])
if holds(cur, token) then
  -- A release granted it to this waiter (whose message may be late or
  -- lost): accept it for the full ttl. The counter has not moved since the
  -- grant, because nobody else can take the lock while it is held. A grant
  -- handed over within the waiter's process takes no look at the queue, so
  -- the place that an earlier attempt of the waiter took may still be
  -- there: left, a later release would grant the lock to a token that
  -- holds it already, or that has let it go.
  dequeue(token)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
if not cur then
  -- Free, usually because nobody wanted it; but if a holder's lease ran out
  -- with waiters queued, the oldest of them goes first, not a newcomer.
  local r = false
  if redis.call('LLEN', KEYS[3]) > 0 then
    r = grant_next(token, false)
  end
  if r ~= 'granted' then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    return {1, next_fence()}
  end
end
if ARGV[3] == '1' then
  local lease = tonumber(ARGV[5])
  enqueue(token, waiter_entry(now_ms() + lease, ARGV[6], ttl, ARGV[7], ARGV[4]), lease, cur)
end
return {0, 0}

-- acquire: take the lock, or turn a reservation into a hold, or (when
-- waiting) join or stay in the queue.
--   ARGV[1] token, ARGV[2] ttl ms, ARGV[3] '1' to wait, '0' to try once,
--   ARGV[4] the waiter's channel, ARGV[5] waiter lease ms, ARGV[6] the grant
--   lease ms the waiter asks for
-- Returns the fencing token when the caller holds the lock, 0 when not. Sent
-- again after a lost reply, it finds its own hold and answers as the first
-- run did.
local token, ttl = ARGV[1], ARGV[2]
local cur = redis.call('GET', KEYS[1])
if cur == token .. '|g' then
  -- A release reserved it for this waiter: the waiter holds it from now,
  -- with the next fencing token.
  dequeue(token)
  redis.call('SET', KEYS[1], token, 'PX', ttl)
  return next_fence()
end
if holds(cur, token) then
  -- A release of the waiter's own process handed it over (its wake may be
  -- late), or this is the attempt sent again. A hand-over within the
  -- process takes no look at the queue, so the place an earlier attempt
  -- took may still be there: left, a later release would grant the lock
  -- to a token that holds it already, or that has let it go.
  dequeue(token)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return fence()
end
if not cur then
  -- Free, usually because nobody wanted it; but if a holder's lease ran
  -- out with waiters queued, the oldest of them goes first, not a newcomer.
  local r = false
  if redis.call('LLEN', KEYS[3]) > 0 then
    r = grant_next(token, false)
  end
  if r ~= 'granted' then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    return next_fence()
  end
end
if ARGV[3] == '1' then
  local lease = tonumber(ARGV[5])
  enqueue(token, waiter_entry(now_ms() + lease, ARGV[6], ttl, ARGV[4]), lease, cur)
end
return 0

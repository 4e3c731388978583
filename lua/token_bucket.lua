-- token_bucket.lua: a token bucket, one rule.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us, capacity
--       (the burst); no UTC offset.
-- Reply: token_bucket_check returns ok, remaining, reset_after_us,
--        retry_after_us, state (what token_bucket_commit writes), reset_now_us
--        (reset_after as things stand, before this request).
--
-- State: a hash {tokens, ts}: the tokens left at time ts (µs since the Unix
-- epoch). A missing key is a full bucket. Tokens refill at limit / period per
-- microsecond up to capacity; a request takes `cost` tokens. The key expires
-- when the bucket would be full again, so an idle key costs nothing.
--
-- Tokens are doubles. Comparisons allow TB_SLACK tokens for their rounding
-- (the error of one refill is about 1e-16 of the capacity); the stored count
-- is never rounded in our favour, so the slack cannot accumulate.
--
-- Example: on an empty key, token_bucket_check(key, now, 1, 10, 60000000, 10)
-- returns true, 9, 6000000, 0, {9, now, 6000000}, 0: one token taken, 9 left,
-- full again in 6 s.

local TB_SLACK = 1e-9

-- The tokens at now (refilled) and the time refill counts from (now, or a
-- lagging writer's later ts). A missing key is a full bucket. Shared with
-- reconcile.lua.
local function token_bucket_load(key, now, limit, period, capacity)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local have, at = tonumber(state[1]), tonumber(state[2])
  if not (have and at) then
    return capacity, now
  end
  if now > at then
    -- Multiply before dividing: elapsed * limit is exact below 2^53.
    return math.min(capacity, have + (now - at) * limit / period), now
  end
  -- A client clock behind the last writer's: no refill, keep its ts.
  return have, at
end

local function token_bucket_store(key, tokens, ts, ttl_us)
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'ts', string.format('%d', ts))
  pexpire_us(key, ttl_us)
end

local function token_bucket_check(key, now, cost, limit, period, capacity)
  local tokens, ts = token_bucket_load(key, now, limit, period, capacity)
  local reset_now = math.max(0, math.ceil((capacity - tokens) * period / limit - TB_SLACK))
  if tokens + TB_SLACK >= cost then
    -- Not clamped at 0: a shortfall within the slack is paid back by the next refill.
    local left = tokens - cost
    -- ts > now only when a client clock lags the last writer's: refill starts at ts.
    local reset = (ts - now) + math.ceil((capacity - left) * period / limit - TB_SLACK)
    local remaining = math.max(0, math.floor(left + TB_SLACK))
    return true, remaining, reset, 0, { left, ts, reset }, reset_now
  end
  local retry = math.max(1, math.ceil((cost - tokens - TB_SLACK) * period / limit))
  return false, math.max(0, math.floor(tokens + TB_SLACK)), reset_now, retry, nil, reset_now
end

local function token_bucket_commit(key, now, cost, nonce, state)
  token_bucket_store(key, state[1], state[2], state[3])
end

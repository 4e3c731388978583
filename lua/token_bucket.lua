-- token_bucket.lua: a token bucket, one rule.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us, capacity
--       (the burst); no UTC offset.
-- Reply: token_bucket_check returns ok, remaining, reset_after_us,
--        retry_after_us, reset_now_us (reset_after as things stand, before
--        this request), then when ok the state token_bucket_commit writes:
--        used, ts and ttl_us.
--
-- State: a hash {used, ts, limit}: the units taken and not yet refilled at
-- time ts (µs since the Unix epoch), and the limit they were written under;
-- the tokens left are capacity - used. A missing key is a full bucket (used =
-- 0). Used units drain at limit / period per microsecond; a request takes
-- `cost` tokens. The key expires when the bucket would be full again, so an
-- idle key costs nothing. (A write-back, reconcile.lua, may store `used`
-- below zero: units that drained already, kept for another instance's
-- write-back to stack after; checks read 0.)
--
-- The state counts used units rather than tokens so that a changed limit or
-- burst keeps what was used: the same `used` read under a new capacity leaves
-- capacity_new - used tokens (below zero when the burst was cut below what
-- is used: denied until enough has drained). Until an admitted check
-- rewrites them under the new limit, the units drain at the limit they were
-- written under, as GCRA's TAT does: the key's expiry was set by that rate,
-- and units drained at a lowered one would outlive their key (10 used at
-- 10/s expire in 1 s; drained at 1/s they were to deny for 9 s more, and
-- the bucket came back full after 1). A denial's retry-after and
-- reset-after say when that drain gets there. A state written without its
-- limit (before it was stored) drains at the limit it is read under. While
-- versions before and after this are deployed side by side, an old writer
-- leaves a new one's `limit` beside its own units: they drain at that limit,
-- which differs from the old writer's only if the deploy changes the limit
-- too (then, as before the limit was stored, the key may expire sooner or
-- later than its units drain).
-- What drains in more than MAX_REFILL_US (2^52 µs) is not kept, as for GCRA.
--
-- Units are doubles. Comparisons allow TB_SLACK tokens for their rounding
-- (the error of one refill is about 1e-16 of the capacity); the stored count
-- is never rounded in our favour, so the slack cannot accumulate.
--
-- Example: on an empty key, token_bucket_check(key, now, 1, 10, 60000000, 10)
-- returns true, 9, 6000000, 0, {1, now, 6000000}, 0: one token taken, 9 left,
-- full again in 6 s.

local TB_SLACK = 1e-9

-- The units used at now (drained since ts at the limit they were written
-- under), the time draining counts from (now, or a lagging writer's later
-- ts) and that limit. A missing key has used none. Shared with
-- reconcile.lua, which asks for what drained past empty too (`below_zero`:
-- a negative count, where a write-back stacks); a check never sees one,
-- lagging clock or not.
local function token_bucket_load(key, now, limit, period, below_zero)
  local state = redis.call('HMGET', key, 'used', 'ts', 'limit')
  local used, at = tonumber(state[1]), tonumber(state[2])
  if not (used and at) then
    return 0, now, limit
  end
  local written = tonumber(state[3])
  if not (written and written >= 1 and written <= MAX_EXACT) then
    written = limit
  end
  used = min(used, MAX_REFILL_US * written / period)
  -- A client clock behind the last writer's (now <= at): no refill, keep
  -- its ts.
  if now > at then
    -- Multiply before dividing: elapsed * limit is exact below 2^53.
    used, at = used - (now - at) * written / period, now
  end
  if below_zero then
    return used, at, written
  end
  return max(0, used), at, written
end

local function token_bucket_store(key, used, ts, ttl_us, limit)
  redis.call('HSET', key, 'used', format('%.17g', used), 'ts', format('%d', ts),
    'limit', format('%d', limit))
  pexpire_us(key, ttl_us)
end

local function token_bucket_check(key, now, cost, limit, period, capacity)
  local used, ts, written = token_bucket_load(key, now, limit, period)
  local tokens = capacity - used
  -- ts > now only when a client clock lags the last writer's: refill starts
  -- at ts, so every time until a refill counts the lag. Until rewritten the
  -- units drain at the limit they were written under.
  local lag = ts - now
  local reset_now = lag + max(0, ceil(used * period / written - TB_SLACK))
  if tokens + TB_SLACK >= cost then
    -- Not clamped at capacity: a shortfall within the slack is paid back by
    -- the next refill.
    local after = used + cost
    local reset = lag + ceil(after * period / limit - TB_SLACK)
    local remaining = max(0, floor(tokens - cost + TB_SLACK))
    return true, remaining, reset, 0, reset_now, after, ts, reset
  end
  local retry = lag + max(1, ceil((cost - tokens - TB_SLACK) * period / written))
  return false, max(0, floor(tokens + TB_SLACK)), reset_now, retry, reset_now
end

local function token_bucket_commit(key, now, cost, nonce, rule, used, ts, ttl)
  token_bucket_store(key, used, ts, ttl, rule[2])
end

-- gcra.lua: the generic cell rate algorithm (GCRA), one rule.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us, capacity
--       (the burst); no UTC offset.
-- Reply: gcra_check returns ok, remaining, reset_after_us, retry_after_us,
--        reset_now_us (reset_after as things stand, before this request),
--        then when ok the state: the new TAT - now, which gcra_commit writes
--        under the rule's limit.
--
-- State: one string value, "<TAT>@<limit>": the theoretical arrival time
-- (TAT) in microseconds since the Unix epoch, and the limit it was written
-- under. The integer part of the TAT is exact; the emission interval
-- T = period / limit is rarely a whole number of microseconds, so the
-- fraction is kept after the decimal point (`1700000000123456.3333333333@10`)
-- instead of being rounded up on every request: rounding up each time would
-- lose the last unit of every full burst. The key expires exactly when the
-- bucket is full again (TAT <= now), so an idle key costs nothing; only a
-- write-back (reconcile.lua) keeps a TAT in the past, for a while, for
-- another instance's write-back to stack after (a full bucket to checks).
--
-- A changed limit keeps what was used. TAT - now is the units still
-- draining times the T they were written under, so a TAT written under
-- limit L_old and read under L_new is rescaled: rel_new = rel_old * L_old /
-- L_new, the same units at the new T (the period is part of the key, so it
-- never changes under one), at most MAX_REFILL_US (2^52 µs) ahead, so the
-- TAT stays exact. A TAT already past means a full bucket under any limit
-- and is not rescaled. A changed burst needs nothing: the TAT does not
-- depend on it, only tau does. An admitted check writes the TAT back under
-- the current limit; until one does (a denial writes nothing), the stored
-- TAT keeps draining at the rate it was written under, so the units kept
-- are those used at each check, and a denial's retry-after and reset-after
-- say when that drain gets there (L_old / L_new times sooner than at L_new).
-- The rescale rounds once, as an addition does (below), far under
-- GCRA_SLACK_US for periods up to days.
--
-- With tau = capacity * T, a request of `cost` is admitted iff
-- max(TAT, now) + cost * T - now <= tau. Doubles round each addition by far
-- less than a nanosecond for periods up to days, so comparisons allow
-- GCRA_SLACK_US (one nanosecond): a decision can differ from exact rational
-- arithmetic only when a unit becomes free within a nanosecond of a whole
-- microsecond, and then it moves by that one microsecond at most.
--
-- Example: on an empty key, gcra_check(key, now, 1, 10, 60000000, 10) (10 per
-- minute, cost 1) returns true, 9, 6000000, 0, 0, 6000000: admitted, 9
-- left, full again in 6 s.

local GCRA_SLACK_US = 1e-3

-- The stored TAT relative to now (negative when it has passed), rescaled
-- from the limit it was written under to `limit`, and how much faster than
-- at `limit` it drains until it is rewritten (written / limit when rescaled,
-- else 1); nil when the key holds none. Shared with reconcile.lua.
--
-- The text is checked and split by one match and its parts converted by
-- arithmetic, where Lua 5.1's tonumber converts each text twice (it tests
-- it, then converts it; strtod is most of the cost). Callgrind, the parse
-- alone in Debian's lua5.1: 4.5k instructions for "<TAT>@<limit>" and 7.3k
-- with a fraction, against 5.8k and 9.9k by plain finds, subs and tonumber.
-- In time (Redis 7.0.15, a loop of 200,000, medians of 7): 0.50 against 0.49
-- µs for a whole TAT, 0.88 against 0.97 µs with a fraction.
-- The whole part is read apart from the fraction, so it stays exact. Only
-- digits pass the match, so the arithmetic cannot raise; a value no script
-- of ours wrote (by hand, say) holds no state unless it matches and both
-- numbers are in range (a fraction of many nines reads as 1).
local function gcra_load(key, now, limit)
  local stored = redis.call('GET', key)
  if not stored then
    return nil, 1
  end
  local whole, frac, written
  if find(stored, '.', 1, true) then
    whole, frac, written = match(stored, '^(%d+)(%.%d+)@(%d+)$')
  else
    whole, written = match(stored, '^(%d+)@(%d+)$')
    frac = 0
  end
  if not whole then
    return nil, 1
  end
  whole, frac, written = whole + 0, frac + 0, written + 0
  if not (whole <= MAX_EXACT and written >= 1 and written <= MAX_EXACT and frac < 1) then
    return nil, 1
  end
  local rel = whole - now + frac
  if rel > 0 and written ~= limit then
    -- Bounded as a rule's own refill is (common.lua), so now + rel stays
    -- exact; only a limit cut by many orders of magnitude reaches it.
    return min(rel * written / limit, MAX_REFILL_US), written / limit
  end
  return rel, 1
end

-- Stores TAT = now + rel under `limit`, expiring when the bucket is full
-- again, or ttl_us from now when given (a TAT in the past reads as a full
-- bucket, but a write-back stacks on it: reconcile.lua).
local function gcra_store(key, now, rel, limit, ttl_us)
  local whole = floor(rel)
  -- '%.17f' never prints an exponent; drop its leading '0'. A whole TAT (an
  -- interval of whole microseconds) is written without a fraction: the same
  -- value, read back the same by gcra_load, without the format.
  local value
  if rel > whole then
    value = format('%d%s@%d', now + whole, sub(format('%.17f', rel - whole), 2), limit)
  else
    value = format('%d@%d', now + whole, limit)
  end
  local ttl_ms = ceil(((ttl_us or rel) - GCRA_SLACK_US) / 1000)
  if ttl_ms < 1 then
    ttl_ms = 1
  end
  redis.call('SET', key, value, 'PX', format('%d', ttl_ms))
end

local function gcra_check(key, now, cost, limit, period, capacity)
  local t = period / limit
  local tau = capacity * t
  -- rel = TAT - now, never negative: a TAT in the past means a full bucket.
  -- (Comparisons, not math.max: a call to it costs more than the rest of a
  -- line like this, 17 against 3 ns in a loop on Redis 7.0.)
  local rel, drain = gcra_load(key, now, limit)
  if not rel or rel < 0 then
    rel = 0
  end
  local new_rel = rel + cost * t
  -- Times until the state is rewritten: a TAT written under another limit
  -- drains `drain` times as fast as one written under this one.
  local reset_now = ceil(rel / drain - GCRA_SLACK_US)
  if reset_now <= 0 then
    reset_now = 0
  end
  if new_rel <= tau + GCRA_SLACK_US then
    local remaining = floor((tau - new_rel + GCRA_SLACK_US) / t)
    return true, remaining, ceil(new_rel - GCRA_SLACK_US), 0, reset_now, new_rel
  end
  local remaining = floor((tau - rel + GCRA_SLACK_US) / t)
  if remaining < 0 then
    remaining = 0
  end
  local retry = ceil((new_rel - tau) / drain - GCRA_SLACK_US)
  if retry < 1 then
    retry = 1
  end
  return false, remaining, reset_now, retry, reset_now
end

local function gcra_commit(key, now, cost, nonce, rule, rel)
  gcra_store(key, now, rel, rule[2])
end

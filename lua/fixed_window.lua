-- fixed_window.lua: a fixed window counter, one rule; with a UTC offset and a
-- period of an hour or a day, the windows are natural (calendar) hours or days.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us, utc_offset_us
--       (capacity is the limit).
-- Reply: fixed_window_check returns ok, remaining, reset_after_us,
--        retry_after_us, reset_now_us (reset_after as things stand, before
--        this request), then when ok the state fixed_window_commit writes:
--        w, c, ttl_us and kept (window_load's).
--
-- State: a hash {w, c}: w = floor((now + utc_offset) / period), the index of
-- the window in local time, and c = units admitted in it; a different w means
-- a new window with c = 0. A request of `cost` is admitted iff c + cost <=
-- limit. Retry-after and reset-after are both the time to the window's end,
-- which is also when the key expires.
--
-- Example: on an empty key 15 s into a natural hour (offset 0),
-- fixed_window_check(key, now, 1, 10, 3600000000, 10, 0) returns true, 9,
-- 3585000000, 0, 0, w, 1, 3585000000, false: 9 left until the hour ends
-- (false: the key held no window yet, so the commit sets its TTL).

local function fixed_window_check(key, now, cost, limit, period, capacity, offset)
  local w, c, _, kept = window_load(key, floor((now + offset) / period), false)
  local left = (w + 1) * period - offset - now
  local reset_now = 0
  if c > 0 then
    reset_now = left
  end
  if c + cost <= limit then
    return true, limit - c - cost, left, 0, reset_now, w, c + cost, left, kept
  end
  return false, max(0, limit - c), left, left, left
end

local function fixed_window_commit(key, now, cost, nonce, rule, w, c, ttl, kept)
  window_store(key, w, c, nil, ttl, kept)
end

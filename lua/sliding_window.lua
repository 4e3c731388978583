-- sliding_window.lua: a sliding window counter (approximate), one rule.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us (capacity is the
--       limit; no UTC offset).
-- Reply: sliding_window_check returns ok, remaining, reset_after_us,
--        retry_after_us, reset_now_us (reset_after as things stand, before
--        this request), then when ok the state sliding_window_commit
--        writes: w, c, p, ttl_us and kept (window_load's).
--
-- State: a hash {w, c, p}: w = floor(now / period), the index of the current
-- fixed window; c = units admitted in it; p = units admitted in window w - 1.
-- At `elapsed` µs into the current window the trailing period is estimated as
--
--     estimate = p * (period - elapsed) / period + c
--
-- (Cloudflare's weighted windows), and a request of `cost` is admitted iff
-- estimate + cost <= limit.
--
-- Error bound. The estimate assumes the previous window's units were spread
-- evenly over it; it is exact when they were. Because estimate >= c, no fixed
-- window ever admits more than `limit`, so a span touching n windows admits
-- at most n * limit. A trailing period ending `elapsed` into window k holds at
-- most c_k + c_(k-1) <= limit + c_(k-1) * elapsed / period < 2 * limit units;
-- that worst case needs all of window k-1's units packed at its very end.
-- Under saturating load each window after the first admits limit - 1 (the
-- previous window's weight never quite reaches 0 before the window ends), so
-- the long-run rate is at most one unit per window under the configured one.
-- The key expires when its current window stops
-- mattering: at the end of the next window (2 * period - elapsed).
--
-- Example: on an empty key 15 s into a minute window,
-- sliding_window_check(key, now, 1, 10, 60000000) returns true, 9, 105000000, 0,
-- 0, w, 1, 0, 105000000, false (false: the key held no window yet).

local SW_SLACK = 1e-9

local function sliding_window_check(key, now, cost, limit, period)
  local w, c, p, kept = window_load(key, floor(now / period), true)
  local elapsed = now - w * period
  if elapsed < 0 then
    elapsed = 0
  end
  local left = period - elapsed
  local estimate = p * left / period + c
  local reset_now = 0
  if c > 0 then
    reset_now = left + period
  elseif p > 0 then
    reset_now = left
  end
  if estimate + cost <= limit + SW_SLACK then
    local remaining = max(0, floor(limit - estimate - cost + SW_SLACK))
    return true, remaining, left + period, 0, reset_now, w, c + cost, p, left + period, kept
  end
  local room = limit - cost
  local retry
  if c <= room then
    -- Still in this window (then p > 0): wait until p's weight has shrunk enough.
    retry = ceil(left - (room - c) * period / p)
  else
    -- Only the next window can admit it, once c (then its p) weighs little enough.
    retry = left + max(0, ceil(period - room * period / c))
  end
  local remaining = max(0, floor(limit - estimate + SW_SLACK))
  return false, remaining, reset_now, max(1, retry), reset_now
end

local function sliding_window_commit(key, now, cost, nonce, rule, w, c, p, ttl, kept)
  -- A window already begun here keeps its p: only c changes.
  if kept then
    p = nil
  end
  window_store(key, w, c, p, ttl, kept)
end

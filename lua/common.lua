-- common.lua: what every script shares: the clock, and how window counters roll.
--
-- A fragment joined in front of check.lua, reconcile.lua and heartbeat.lua
-- (and of the algorithm fragments), not a script of its own.
--
-- KEYS / ARGV: none of its own.
-- Reply: none; it defines
--   script_now(arg)           the caller's µs timestamp, or the server's TIME
--                             when arg is "0";
--   pexpire_us(key, us)       PEXPIRE rounded up to whole ms, at least 1;
--   window_load(key, cur, keep_previous)
--                             a window counter hash {w, c, p} rolled to window
--                             `cur`: a window that has passed clears c, and
--                             when keep_previous the one just before becomes p;
--   window_store(key, w, c, p, ttl_us)
--                             writes it back (p nil for a fixed window).
--
-- Example: with TIME = {1700000000, 123456}, script_now('0') returns
-- 1700000000123456; script_now('42') returns 42.

local function script_now(arg)
  local now = tonumber(arg)
  if now == 0 then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return now
end

local function pexpire_us(key, us)
  redis.call('PEXPIRE', key, string.format('%d', math.max(1, math.ceil(us / 1000))))
end

local function window_load(key, cur, keep_previous)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, c, p = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if not keep_previous then
    p = 0
    if w == nil or w < cur then
      return cur, 0, 0
    end
  elseif w == nil or w < cur - 1 then
    return cur, 0, 0
  elseif w == cur - 1 then
    return cur, 0, c
  end
  -- w > cur only when a client clock lags the last writer's: keep counting in w.
  return w, c, p
end

local function window_store(key, w, c, p, ttl_us)
  if p then
    redis.call('HSET', key, 'w', string.format('%d', w), 'c', string.format('%d', c),
      'p', string.format('%d', p))
  else
    redis.call('HSET', key, 'w', string.format('%d', w), 'c', string.format('%d', c))
  end
  pexpire_us(key, ttl_us)
end

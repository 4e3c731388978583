-- common.lua: what every script shares: the clock, and how window counters roll.
--
-- A fragment joined in front of check.lua, reconcile.lua and heartbeat.lua
-- (and of the algorithm fragments), not a script of its own.
--
-- KEYS / ARGV: none of its own.
-- Reply: none; it defines
--   refuse(script, msg)       raises the error reply "ERR tierlimit <script>:
--                             <msg>"; called only before a script's first write;
--   int_arg(script, name, s, lo, hi)
--                             s as a number when it is a decimal integer
--                             string (optional minus, at most 16 digits: no
--                             hex, exponent, fraction, nan or inf) within
--                             [lo, hi], else refuse;
--   rule_args(script, i)      the rule at ARGV[i]: its five numbers joined by
--                             ':' (code:limit:period_us:capacity:
--                             utc_offset_us, e.g. "1:10:60000000:10:0"),
--                             each checked against the same bounds Rule
--                             enforces in Rust (below), else refuse;
--                             returned as a table { code, limit, period,
--                             capacity, offset } the caller must not change
--                             (it is memoised: see RULES_SEEN);
--   server_time()             the server's TIME in µs since the Unix epoch;
--   script_now(arg)           the caller's µs timestamp, or server_time()
--                             when arg is "0";
--   pexpire_us(key, us)       PEXPIRE rounded up to whole ms, at least 1;
--   window_load(key, cur, keep_previous)
--                             a window counter hash {w, c, p} rolled to window
--                             `cur`: a window that has passed clears c, and
--                             when keep_previous the one just before becomes p;
--                             returns w, c, p and kept: whether the key holds
--                             window w already (then its TTL is w's);
--   window_store(key, w, c, p, ttl_us, kept)
--                             writes it back (p nil: not written); when kept,
--                             only c (and p) and not the TTL, which the write
--                             that started window w set to the same instant.
--
-- Example: with TIME = {1700000000, 123456}, script_now('0') returns
-- 1700000000123456; script_now('42') returns 42.

-- The standard functions the fragments use, as locals: a global is a table
-- lookup on every use (two for math.floor), a local is not. A Functions
-- library cannot reach math or string while it loads, so every main body
-- (check.lua, check_batch.lua, reconcile.lua, heartbeat.lua) binds them
-- first: `if floor == nil then bind_std() end`, on every call of a script
-- and on the first call of a library's function.
local floor, ceil, max, min, format, match, find, sub
local function bind_std()
  floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
  format, match, find, sub = string.format, string.match, string.find, string.sub
end

-- The bounds of tierlimit_core (rule.rs), so a call by hand meets the same
-- rules as one from Rust:
--   MAX_EXACT              2^53, the largest integer a double holds exactly;
--   MAX_LIMIT              2^51: a limit, burst or cost; the largest sum of
--                          counts (sliding window: previous + current + cost)
--                          then stays below 2^53;
--   MAX_SLIDING_LOG_LIMIT  a sliding log adds one member per unit: this bounds
--                          the server time of one call to milliseconds;
--   MAX_REFILL_US          2^52: how far GCRA's arrival time / the token
--                          bucket's refill may run ahead of now;
--   MAX_OFFSET_US          a UTC offset strictly within one day.
local MAX_EXACT = 9007199254740992
local MAX_LIMIT = 2251799813685248
local MAX_SLIDING_LOG_LIMIT = 1000
local MAX_REFILL_US = 4503599627370496
local MAX_OFFSET_US = 86399000000
-- A marker or other TTL in ms: up to about 317 years.
local MAX_TTL_MS = 10000000000000

local function refuse(script, msg)
  error({ err = 'ERR tierlimit ' .. script .. ': ' .. msg })
end

local function int_arg(script, name, s, lo, hi)
  if type(s) ~= 'string' or #s > 17 or not match(s, '^%-?%d+$') then
    refuse(script, name .. ' must be a decimal integer, got "'
      .. sub(tostring(s), 1, 40) .. '"')
  end
  -- Digits only (matched above): arithmetic converts it once, tonumber twice.
  local n = s + 0
  if n < lo or n > hi then
    refuse(script, format('%s must be in [%d, %d], got %s', name, lo, hi, s))
  end
  return n
end

-- One rule is one argument, not five: Redis pays for each argument of a call
-- about as much as for a few lines of Lua (it parses it, makes an object of
-- it, then a Lua string), and the library's memo finds a rule by one lookup.
local function checked_rule_args(script, s)
  local c, l, p, b, o
  if type(s) == 'string' then
    c, l, p, b, o = match(s, '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*)$')
  end
  if not c then
    refuse(script, 'a rule must be code:limit:period_us:capacity:utc_offset_us, got "'
      .. sub(tostring(s), 1, 100) .. '"')
  end
  local code = int_arg(script, 'algorithm code', c, 1, 5)
  local limit_max = MAX_LIMIT
  if code == 3 then
    limit_max = MAX_SLIDING_LOG_LIMIT
  end
  local limit = int_arg(script, 'limit', l, 1, limit_max)
  local period = int_arg(script, 'period_us', p, 1000, MAX_EXACT)
  local capacity = int_arg(script, 'capacity', b, 1, MAX_LIMIT)
  local offset_max = 0
  if code == 5 then
    offset_max = MAX_OFFSET_US
  end
  local offset = int_arg(script, 'utc_offset_us', o, -offset_max, offset_max)
  if code <= 2 then
    if limit > period then
      refuse(script, 'limit must be at most period_us (one unit per microsecond)')
    end
    -- The product may round up by an ulp or two: the margin keeps every rule
    -- Rust accepts (capacity * period <= MAX_REFILL_US * limit, exactly) and
    -- costs nothing, now + MAX_REFILL_US being exact until 2112.
    if capacity * period / limit > MAX_REFILL_US * (1 + 1e-12) then
      refuse(script, 'capacity * period_us / limit must be at most 2^52')
    end
  elseif capacity ~= limit then
    refuse(script, 'capacity must equal the limit for this algorithm')
  end
  return { code, limit, period, capacity, offset }
end

-- Memos of arguments that passed their checks, by their text: nil in a
-- script, which would start them empty on every call and so only pay for
-- them; the Functions library sets them to tables once, when it loads, and
-- keeps them from call to call, so each rule set's numbers are parsed and
-- checked once per server, not on every check. Bounded: a full memo starts
-- over.
--   RULES_SEEN  a rule's table, by its argument's text;
--   INTS_SEEN   a decimal integer argument from 1 to MAX_LIMIT, by its
--               text: a request's cost, a batch's counts (decide.lua's
--               check_call_args and int_seen). Parsing and checking a
--               number costs Redis more than a few lines of Lua (the
--               pattern match, strtod), so each text is checked once.
local RULES_SEEN, RULES_SEEN_N, INTS_SEEN, INTS_SEEN_N = nil, 0, nil, 0
local SEEN_MAX = 512

local function rule_args(script, i)
  local s = ARGV[i]
  local rule = RULES_SEEN and RULES_SEEN[s]
  if rule then
    return rule
  end
  rule = checked_rule_args(script, s)
  -- Only arguments that pass (strings) are kept.
  if RULES_SEEN then
    if RULES_SEEN_N >= SEEN_MAX then
      RULES_SEEN, RULES_SEEN_N = {}, 0
    end
    RULES_SEEN[s], RULES_SEEN_N = rule, RULES_SEEN_N + 1
  end
  return rule
end

-- TIME's two fields are always decimal digits, so arithmetic converts them
-- (one strtod each); tonumber would convert each twice (Lua 5.1's tonumber
-- tests the text, then converts it).
local function server_time()
  local time = redis.call('TIME')
  return time[1] * 1000000 + time[2]
end

local function script_now(arg)
  local now = tonumber(arg)
  if now == 0 then
    now = server_time()
  end
  return now
end

local function pexpire_us(key, us)
  redis.call('PEXPIRE', key, format('%d', max(1, ceil(us / 1000))))
end

local function window_load(key, cur, keep_previous)
  if not keep_previous then
    -- p is not needed: two fields read instead of three (a fifth of the read).
    local state = redis.call('HMGET', key, 'w', 'c')
    local w = tonumber(state[1])
    if w == nil or w < cur then
      return cur, 0, 0, false
    end
    return w, tonumber(state[2]) or 0, 0, true
  end
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, c, p = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if w == nil or w < cur - 1 then
    return cur, 0, 0, false
  elseif w == cur - 1 then
    return cur, 0, c, false
  end
  -- w > cur only when a client clock lags the last writer's: keep counting in w.
  return w, c, p, true
end

-- A window's key expires at a fixed instant (its end, or a period after it):
-- the write that starts the window sets it, and later writes in the same
-- window leave it, and w, as they are (one PEXPIRE and two fields fewer).
local function window_store(key, w, c, p, ttl_us, kept)
  if kept then
    if p then
      redis.call('HSET', key, 'c', format('%d', c), 'p', format('%d', p))
    else
      redis.call('HSET', key, 'c', format('%d', c))
    end
    return
  end
  if p then
    redis.call('HSET', key, 'w', format('%d', w), 'c', format('%d', c),
      'p', format('%d', p))
  else
    redis.call('HSET', key, 'w', format('%d', w), 'c', format('%d', c))
  end
  pexpire_us(key, ttl_us)
end

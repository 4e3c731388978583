-- reconcile.lua: writes units admitted locally during an outage back to one
-- rule's key, as if those requests had gone to Redis. Idempotent per batch.
--
-- A script of its own (not joined with the algorithm files); it reads and
-- writes the same state they do.
--
-- KEYS[1]  the rule's storage key: tl:{<escaped user key>}:<set>:<rule id>.
-- KEYS[2]  the batch marker: KEYS[1] .. ':rc:' .. <batch id> (same hash tag,
--          so the same Cluster slot).
-- ARGV[1]  now in µs since the Unix epoch, or "0" to use the server's TIME.
-- ARGV[2]  algorithm code (1 GCRA, 2 token bucket, 3 sliding log, 4 sliding
--          window, 5 fixed window).
-- ARGV[3..6] limit, period_us, capacity, utc_offset_us (as in check.lua).
-- ARGV[7]  units admitted locally.
-- ARGV[8]  first_us, ARGV[9] last_us: when the first and the last of them were
--          admitted (µs since the epoch, the instance's clock). For the window
--          algorithms both fall in one window.
-- ARGV[10] marker TTL in ms: how long a re-sent batch is recognised.
-- ARGV[11] batch id (also makes sliding-log members unique).
--
-- Reply: { status, units_applied }, status 1 = applied now, 0 = this batch was
-- already applied to this key (nothing changed), 2 = the units' window has
-- passed (nothing to change).
--
-- It never denies: the requests already happened. It caps the debt at one
-- window, so no key is punished beyond one full period however much the fleet
-- over-admitted:
--   GCRA / token bucket: the theoretical arrival time moves by units * period /
--     limit from max(TAT, first_us) (a full bucket has no TAT: the units start
--     at first_us and may have refilled already), and at most to now +
--     capacity * T (an empty bucket, refilling at the normal rate). Units whose
--     last one is a full period old are expired.
--   sliding log: the units become members spread over [first_us, last_us],
--     those still inside the trailing period, up to `limit` members in all.
--   sliding window counter / fixed window: the units are added to the counter
--     of the window they fell in (current or, for the sliding counter, the
--     previous one), capped at `limit`.
--
-- Example: 3 units of a 10-per-minute GCRA rule admitted locally, batch b1:
--   EVALSHA <sha> 2 tl:{u}:api:g60000000x10 tl:{u}:api:g60000000x10:rc:b1
--     0 1 10 60000000 10 0 3 <first_us> <last_us> 120000 b1
--   -> 1) 1  2) 3     (the same call again -> 1) 0  2) 0)

local key, marker = KEYS[1], KEYS[2]
if redis.call('EXISTS', marker) == 1 then
  return { 0, 0 }
end

local now = tonumber(ARGV[1])
if now == 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local code = tonumber(ARGV[2])
local limit, period = tonumber(ARGV[3]), tonumber(ARGV[4])
local capacity, offset = tonumber(ARGV[5]), tonumber(ARGV[6])
local units = tonumber(ARGV[7])
local first, last = tonumber(ARGV[8]), tonumber(ARGV[9])
local marker_ttl, batch = ARGV[10], ARGV[11]

local function int(x)
  return string.format('%d', x)
end

local function ttl(key_, us)
  redis.call('PEXPIRE', key_, int(math.max(1, math.ceil(us / 1000))))
end

-- GCRA and the token bucket share one rule: the arrival time (relative to now)
-- after the units, capped at a full bucket's worth. `rel` is the stored arrival
-- time relative to now, or nil for a full bucket; units admitted long ago start
-- from when they were admitted, so they may have refilled already.
local function debt_after(rel)
  rel = rel or -math.huge
  local t = period / limit
  local start = math.max(rel, first - now)
  return math.min(start + units * t, capacity * t)
end

local status, applied = 1, units

if (code == 1 or code == 2) and last + period <= now then
  -- A full period has passed since the last of them: they can no longer matter.
  status, applied = 2, 0
elseif code == 1 then
  local rel = nil
  local stored = redis.call('GET', key)
  if stored then
    local whole, frac = string.match(stored, '^(%d+)(%.?%d*)$')
    if whole then
      rel = tonumber(whole) - now + (tonumber(frac) or 0)
    end
  end
  local new_rel = debt_after(rel)
  if new_rel <= 0 then
    status, applied = 2, 0
  else
    local whole = math.floor(new_rel)
    local frac = string.sub(string.format('%.17f', new_rel - whole), 2)
    redis.call('SET', key, int(now + whole) .. frac, 'PX', int(math.max(1, math.ceil(new_rel / 1000))))
  end
elseif code == 2 then
  local rate = limit / period
  local rel = nil
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local have, at = tonumber(state[1]), tonumber(state[2])
  if have and at then
    local tokens = math.min(capacity, have + math.max(0, now - at) * rate)
    if tokens < capacity then
      rel = (capacity - tokens) / rate
    end
  end
  local new_rel = debt_after(rel)
  if new_rel <= 0 then
    status, applied = 2, 0
  else
    local left = capacity - new_rel * rate
    redis.call('HSET', key, 'tokens', string.format('%.17g', math.max(0, left)), 'ts', int(now))
    ttl(key, new_rel)
  end
elseif code == 3 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - period))
  local room = limit - redis.call('ZCARD', key)
  applied = 0
  local newest = 0
  for j = 1, units do
    if applied >= room then
      break
    end
    local at = first
    if units > 1 then
      at = first + math.floor((last - first) * (j - 1) / (units - 1))
    end
    if at > now - period then
      redis.call('ZADD', key, int(at), 'rc:' .. batch .. ':' .. j)
      applied = applied + 1
      newest = math.max(newest, at)
    end
  end
  if applied == 0 then
    status = 2
  else
    local keep = math.max(redis.call('PTTL', key) * 1000, newest + period - now)
    ttl(key, keep)
  end
elseif code == 4 or code == 5 then
  if code == 4 then
    offset = 0
  end
  local cur = math.floor((now + offset) / period)
  local ew = math.floor((last + offset) / period)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, c, p = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if w == nil or w < cur - 1 then
    w, c, p = cur, 0, 0
  elseif w == cur - 1 then
    w, c, p = cur, 0, c
  end
  -- A clock ahead of the server's can put the units in a window not begun here: count them now.
  ew = math.min(ew, w)
  if ew == w then
    applied = math.min(units, math.max(0, limit - c))
    c = c + applied
  elseif code == 4 and ew == w - 1 then
    applied = math.min(units, math.max(0, limit - p))
    p = p + applied
  else
    status, applied = 2, 0
  end
  if status == 1 then
    local window_end = (w + 1) * period - offset - now
    if code == 4 then
      redis.call('HSET', key, 'w', int(w), 'c', int(c), 'p', int(p))
      ttl(key, window_end + period)
    else
      redis.call('HSET', key, 'w', int(w), 'c', int(c))
      ttl(key, window_end)
    end
  end
else
  return redis.error_reply('ERR tierlimit reconcile: unknown algorithm code ' .. ARGV[2])
end

redis.call('SET', marker, '1', 'PX', marker_ttl)
return { status, applied }

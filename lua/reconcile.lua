-- reconcile.lua: writes units admitted locally during an outage back to one
-- rule's key, as if those requests had gone to Redis. Idempotent per batch.
--
-- The main body of the reconcile script: the Rust side prepends common.lua
-- and the algorithm files, whose load and store functions it uses, so it reads
-- and writes exactly the state the check does.
--
-- KEYS[1]  the rule's storage key: tl:{<escaped user key>}:<set>:<rule id>.
-- KEYS[2]  the batch marker: KEYS[1] .. ':rc:' .. <batch id> (same hash tag,
--          so the same Cluster slot).
-- ARGV[1]  now in µs since the Unix epoch, or "0" to use the server's TIME.
-- ARGV[2]  the rule: code:limit:period_us:capacity:utc_offset_us (as in
--          check.lua).
-- ARGV[3]  units admitted locally.
-- ARGV[4]  first_us, ARGV[5] last_us: when the first and the last of them were
--          admitted (µs since the epoch, the instance's clock); for GCRA and
--          the token bucket, first_us is when their debt began (the last full
--          refill before them: tierlimit-core's owed_since_us). For the window
--          algorithms both fall in one window.
-- ARGV[6]  marker TTL in ms: how long a re-sent batch is recognised.
-- ARGV[7]  batch id (also makes sliding-log members unique).
-- ARGV[8]  (optional) with ARGV[1] 0: the instance's clock as it sent this,
--          µs since the epoch. first_us and last_us are on that clock; the
--          script moves them by the server's TIME minus it, so a host whose
--          clock is behind the server's does not see units of a window still
--          live on Redis' clock dropped as passed (nor one ahead see them
--          charged to a window after theirs). "0" or absent: no shift.
--
-- Reply: { status, units_applied }, status 1 = applied now, 0 = this batch was
-- already applied to this key (nothing changed), 2 = the units no longer
-- count: their window has passed, or their bucket refilled (none applied; a
-- bucket keeps where they end, in the past, for other instances' units to
-- stack after).
--
-- It never denies: the requests already happened. It caps the debt at one
-- window, so no key is punished beyond one full period however much the fleet
-- over-admitted:
--   GCRA / token bucket: the theoretical arrival time moves by units * period /
--     limit from max(TAT, first_us) (a TAT in the past included; a missing key
--     has none: the units start at first_us and may have refilled already),
--     and at most to now +
--     capacity * T (an empty bucket, refilling at the normal rate), or where
--     it already was when a lowered limit or burst left it further. Units whose
--     last one is as old as a full bucket's refill (capacity * T: a period
--     unless the burst differs from the limit) are expired.
--   sliding log: the units become members spread over [first_us, last_us],
--     those still inside the trailing period, up to `limit` members in all;
--     the units already outside the window are skipped by bisection, so an
--     entry owing 25 M units costs what one owing `limit` does.
--   sliding window counter / fixed window: the units, spread evenly over
--     [first_us, last_us] as the sliding log spreads them, are added to the
--     counter of the window each fell in (current or, for the sliding
--     counter, the previous one; a window passed takes none), capped at
--     `limit` (a count already above it, from a lowered limit, is kept as it
--     is). One window's units moved onto this clock (ARGV[8]) may fall in two.
--
-- The state is read with the check's own load functions, so state written
-- under another limit or burst of the same key is carried over exactly as a
-- check carries it (see gcra.lua, token_bucket.lua), and the write stores
-- this call's limit.
--
-- Bad input is refused before anything is written, as in check.lua: every
-- number a decimal integer string within common.lua's bounds (units below
-- 2^53, first_us <= last_us, marker TTL 1 ms to 10^13 ms), KEYS[2] exactly
-- KEYS[1] .. ':rc:' .. <batch id>, and KEYS[1] empty or of the type its
-- algorithm stores (else "WRONGTYPE tierlimit reconcile: ...").
--
-- Example: 3 units of a 10-per-minute GCRA rule admitted locally, batch b1:
--   EVALSHA <sha> 2 tl:{u}:api:g60000000 tl:{u}:api:g60000000:rc:b1
--     0 1:10:60000000:10:0 3 <first_us> <last_us> 120000 b1
--   -> 1) 1  2) 3     (the same call again -> 1) 0  2) 0)

if floor == nil then bind_std() end

local key, marker = KEYS[1], KEYS[2]
if #KEYS ~= 2 or (#ARGV ~= 7 and #ARGV ~= 8) then
  return redis.error_reply('ERR tierlimit reconcile: expected 2 keys and 7 or 8 arguments')
end
-- Every argument is read and checked before the first write.
local now_arg = int_arg('reconcile', 'now_us', ARGV[1], 0, MAX_EXACT)
local code, limit, period, capacity, offset = unpack(rule_args('reconcile', 2))
-- Below 2^53, so units + 1 (the bisection's end) stays exact.
local units = int_arg('reconcile', 'units', ARGV[3], 1, MAX_EXACT - 1)
local first = int_arg('reconcile', 'first_us', ARGV[4], 0, MAX_EXACT)
local last = int_arg('reconcile', 'last_us', ARGV[5], first, MAX_EXACT)
local marker_ttl = format('%d', int_arg('reconcile', 'marker_ttl_ms', ARGV[6], 1, MAX_TTL_MS))
local batch = ARGV[7]
local sent = int_arg('reconcile', 'sent_us', ARGV[8] or '0', 0, MAX_EXACT)
if #batch == 0 or #batch > 512 then
  refuse('reconcile', 'the batch id must be 1 to 512 bytes')
end
if marker ~= key .. ':rc:' .. batch then
  refuse('reconcile', 'KEYS[2] must be KEYS[1] .. ":rc:" .. <batch id>')
end
local TYPES = { 'string', 'hash', 'zset', 'hash', 'hash' }
local held = redis.call('TYPE', key).ok
if held ~= 'none' and held ~= TYPES[code] then
  return redis.error_reply('WRONGTYPE tierlimit reconcile: KEYS[1] holds a ' .. held
    .. ', algorithm ' .. code .. ' stores a ' .. TYPES[code] .. '; nothing was written')
end

if redis.call('EXISTS', marker) == 1 then
  return { 0, 0 }
end

local now = script_now(ARGV[1])
if now_arg == 0 and sent > 0 then
  -- The units' times onto the server's clock (see ARGV[8]): what was the
  -- sender's now is the server's now.
  local shift = now - sent
  first = min(max(first + shift, 0), MAX_EXACT)
  last = min(max(last + shift, first), MAX_EXACT)
end

-- GCRA and the token bucket share one rule: the arrival time (relative to now)
-- after the units, capped at a full bucket's worth. `rel` is the stored arrival
-- time relative to now, or nil for a full bucket; the units start owing at
-- `first` (where the instance's last full refill left the bucket: see
-- owed_since_us in tierlimit-core), so units owed long ago may have
-- refilled already.
-- A debt already above a full bucket (the limit or burst was lowered since it
-- was written) is kept, not cut to the cap.
local function debt_after(rel)
  rel = rel or -math.huge
  local t = period / limit
  local start = max(rel, first - now)
  return min(start + units * t, max(capacity * t, rel))
end

local status, applied = 1, units

-- Unit j (1..units) was admitted at at(j), spread evenly over [first, last]:
-- the sliding log's members, and how a window's units fall on either side
-- of a boundary. at() never decreases (each double operation rounds
-- monotonically), so the units after a time are j0..units, and j0 is found by
-- bisection: O(log units), never O(units).
local function at(j)
  if units == 1 then
    return first
  end
  return first + floor((last - first) * (j - 1) / (units - 1))
end
-- The first unit admitted after `t` (units + 1 when none was).
local function first_after(t)
  local lo, hi = 1, units + 1
  while lo < hi do
    local mid = lo + floor((hi - lo) / 2)
    if at(mid) > t then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

if code == 1 or code == 2 then
  local rate = limit / period
  local rel, ts = nil, now
  if code == 1 then
    -- Rescaled to this limit; the write below stores it under this limit.
    rel = gcra_load(key, now, limit)
  else
    local used
    used, ts = token_bucket_load(key, now, limit, period, true)
    if used ~= 0 then
      rel = used / rate
    end
  end
  local new_rel = debt_after(rel)
  local full = capacity / rate
  if last + full <= now then
    -- A full bucket would have refilled since the last unit (a period,
    -- unless the burst is not the limit): nothing of them is left.
    status, applied = 2, 0
  else
    if new_rel <= 0 then
      -- They refilled: none applied.
      status, applied = 2, 0
    end
    -- Where they end is kept until a full refill after it, once in the
    -- past too (a full bucket to checks): the other instances' units of
    -- the same outage stack after them, however late each writes back.
    -- Alone, each instance's units read as refilled, and a fleet that
    -- spent the bucket between them got it back whole. (A check admitted
    -- meanwhile keeps the key only until its own refill: a write-back after
    -- both starts from its own units again.)
    local ttl = full + new_rel
    if ttl > 0 then
      if code == 1 then
        gcra_store(key, now, new_rel, limit, ttl)
      else
        token_bucket_store(key, new_rel * rate, ts, (ts - now) + ttl, limit)
      end
    end
  end
elseif code == 3 then
  local since = now - period
  redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', since))
  local room = limit - redis.call('ZCARD', key)
  local lo = first_after(since)
  -- The newest units still inside the window, up to the room the log has:
  -- the ones that bound the key longest.
  local start = max(lo, units - room + 1)
  applied = 0
  if start <= units then
    applied = units - start + 1
    local args = {}
    for j = start, units do
      args[#args + 1] = format('%d', at(j))
      args[#args + 1] = 'rc:' .. batch .. ':' .. format('%d', j)
      if #args >= 2 * SLIDING_LOG_BATCH or j == units then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    pexpire_us(key, max(redis.call('PTTL', key) * 1000, at(units) + period - now))
  elseif lo > units then
    -- Every unit has left the window.
    status = 2
  end
  -- Else the log is full: none taken (a striped write-back spills them).
elseif code == 4 or code == 5 then
  local sliding = code == 4
  if sliding then
    offset = 0
  end
  local w, c, p, kept = window_load(key, floor((now + offset) / period), sliding)
  -- Each window gets its own units: the units of one of the sender's windows,
  -- moved onto this clock (ARGV[8]), may straddle two of these. Those of a
  -- window not begun here (a clock ahead) count in the current one.
  local start = w * period - offset
  local current = units + 1 - first_after(start - 1)
  local previous = units + 1 - first_after(start - period - 1) - current
  if current == 0 and (previous == 0 or not sliding) then
    status, applied = 2, 0
  else
    applied = min(current, max(0, limit - c))
    c = c + applied
    if sliding then
      local earlier = min(previous, max(0, limit - p))
      p = p + earlier
      applied = applied + earlier
    end
  end
  if status == 1 then
    local window_end = (w + 1) * period - offset - now
    if sliding then
      window_store(key, w, c, p, window_end + period, kept)
    else
      window_store(key, w, c, nil, window_end, kept)
    end
  end
else
  return redis.error_reply('ERR tierlimit reconcile: unknown algorithm code ' .. ARGV[2])
end

redis.call('SET', marker, '1', 'PX', marker_ttl)
return { status, applied }

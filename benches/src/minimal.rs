//! The minimal script of each algorithm: the baseline of the script cost
//! target (`benches/script_cost.rs`, `benches/script-instructions.sh`).

/// A minimal script of each algorithm, in code order, with the check
/// script's keys and arguments as they were before stop 33 (KEYS: one per
/// rule; ARGV: now, cost, nonce, then code, limit, period_us, capacity,
/// offset_us per rule, each rule's numbers apart; kept as they were, so the
/// baseline did not change when tierlimit's check took each rule as one
/// argument): per rule one
/// read and one write with its expiry (the sliding log: trim, count, add,
/// expire), every rule checked before any is written, server time, no
/// argument checks, a reply of 4 integers.
pub const MINIMAL_SCRIPTS: [&str; 5] = [
    // GCRA: the TAT as an integer string.
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[2])
local new = {}
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  local tick = tonumber(ARGV[a + 3]) / tonumber(ARGV[a + 2])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local nt = tat + cost * tick
  local over = nt - now - tonumber(ARGV[a + 4]) * tick
  if over > 0 then return { 0, i - 1, math.ceil(over), now } end
  new[i] = nt
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%d', math.ceil(new[i])), 'PX',
    string.format('%d', math.ceil((new[i] - now) / 1000)))
end
return { 1, 0, 0, now }
",
    // Token bucket: a hash {t, ts}.
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[2])
local left = {}
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  local limit, period, cap = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local s = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens = tonumber(s[1])
  if tokens then
    tokens = math.min(cap, tokens + (now - tonumber(s[2])) * limit / period)
  else
    tokens = cap
  end
  if tokens < cost then return { 0, i - 1, math.ceil((cost - tokens) * period / limit), now } end
  left[i] = { tokens - cost, math.ceil((cap - tokens + cost) * period / limit / 1000) }
end
for i = 1, #KEYS do
  redis.call('HSET', KEYS[i], 't', string.format('%.17g', left[i][1]), 'ts', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[i], string.format('%d', math.max(1, left[i][2])))
end
return { 1, 0, 0, now }
",
    // Sliding log: a sorted set of admissions.
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[2])
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  local limit, period = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - period))
  if redis.call('ZCARD', KEYS[i]) + cost > limit then return { 0, i - 1, 1, now } end
end
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  for j = 1, cost do
    redis.call('ZADD', KEYS[i], string.format('%d', now), now .. ':' .. ARGV[3] .. ':' .. j)
  end
  redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil(tonumber(ARGV[a + 3]) / 1000)))
end
return { 1, 0, 0, now }
",
    // Sliding window counter: a hash {w, c, p}.
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[2])
local new = {}
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  local limit, period = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local cur = math.floor(now / period)
  local s = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
  local w, c, p = tonumber(s[1]), tonumber(s[2]) or 0, tonumber(s[3]) or 0
  if w ~= cur then
    if w == cur - 1 then p = c else p = 0 end
    c = 0
  end
  if p * (period - (now - cur * period)) / period + c + cost > limit then
    return { 0, i - 1, 1, now }
  end
  new[i] = { cur, c + cost, p, math.ceil(2 * period / 1000) }
end
for i = 1, #KEYS do
  local n = new[i]
  redis.call('HSET', KEYS[i], 'w', string.format('%d', n[1]), 'c', string.format('%d', n[2]),
    'p', string.format('%d', n[3]))
  redis.call('PEXPIRE', KEYS[i], string.format('%d', n[4]))
end
return { 1, 0, 0, now }
",
    // Fixed window: a counter per window, written with its expiry.
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[2])
local new = {}
for i = 1, #KEYS do
  local a = 3 + 5 * (i - 1)
  local limit, period = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local cur = math.floor(now / period)
  local key = KEYS[i] .. ':' .. cur
  local c = tonumber(redis.call('GET', key)) or 0
  if c + cost > limit then return { 0, i - 1, (cur + 1) * period - now, now } end
  new[i] = { key, c + cost, math.ceil(((cur + 1) * period - now) / 1000) }
end
for i = 1, #KEYS do
  local n = new[i]
  redis.call('SET', n[1], string.format('%d', n[2]), 'PX', string.format('%d', n[3]))
end
return { 1, 0, 0, now }
",
];

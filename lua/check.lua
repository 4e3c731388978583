-- check.lua: checks one request against every rule of a rule set, all or nothing.
--
-- The main body of the check script. The Rust side prepends common.lua and
-- the algorithm files (gcra.lua, token_bucket.lua, sliding_log.lua, sliding_window.lua,
-- fixed_window.lua), which define <alg>_check and <alg>_commit.
--
-- KEYS[i]  storage key of rule i: tl:{<escaped user key>}:<set>:<rule id>
--          (all rules share the hash tag, so one Cluster slot).
-- ARGV[1]  now in µs since the Unix epoch, or "0" to use the server's TIME.
-- ARGV[2]  cost: units this request takes from every rule (>= 1).
-- ARGV[3]  nonce: a random u64 per call, keeps sliding-log members unique.
-- ARGV[4 + 5(i-1) ..] five per rule i: algorithm code (1 GCRA, 2 token bucket,
--          3 sliding log, 4 sliding window, 5 fixed window), limit, period_us,
--          capacity, utc_offset_us.
--
-- Reply: an array of integers
--   { allowed (1/0), deciding rule (0-based), retry_after_us (0 when allowed),
--     now_us, then per rule i: remaining_i, reset_after_us_i }
-- Deciding rule: when denied, the denying rule with the longest retry-after;
-- when allowed, the rule with the fewest remaining (ties: the lowest index).
-- When allowed, remaining_i and reset_after_us_i describe rule i after this
-- request; when denied nothing is written anywhere, and they describe rule i
-- as it stands (remaining_i = units it would admit now).
--
-- Every rule is checked first, without writing; only if all admit is each
-- committed. A denied request therefore changes no rule's state.
--
-- Bad input is refused before anything is read or written, with an error
-- reply "ERR tierlimit check: ...": every number must be a decimal integer
-- string (no hex, exponent, fraction, nan, inf) within the bounds of
-- common.lua (which are tierlimit_core's Rule bounds: cost and limits at most
-- 2^51, a sliding log's limit at most 1000, periods 1 ms to 2^53 µs, ...),
-- the cost at most every rule's capacity, no key named twice (one key under
-- two algorithms could not be committed whole). A key that holds a type its
-- algorithm does not store fails its read, before any commit, with
-- "WRONGTYPE tierlimit check: ...". Once the checks pass, every write is
-- bounded (TTLs at most 2^53 µs, at most 1000 sorted-set members), so a commit
-- never fails half-way.
--
-- Numbers passed to redis.call are formatted with string.format: Redis turns a
-- bare Lua number into a string with %.14g, which loses digits of 16-digit
-- microsecond timestamps.
--
-- Example (redis-cli; <sha> is the SHA1 of the joined script): 10 per minute
-- by GCRA for user-1, server time, cost 1, on an empty key:
--   EVALSHA <sha> 1 tl:{user-1}:api:g60000000x10 0 1 42 1 10 60000000 10 0
--   -> 1) 1  2) 0  3) 0  4) <now_us>  5) 9  6) 6000000

local CHECKS = {
  gcra_check, token_bucket_check, sliding_log_check, sliding_window_check, fixed_window_check,
}
local COMMITS = {
  gcra_commit, token_bucket_commit, sliding_log_commit, sliding_window_commit, fixed_window_commit,
}

local rules = #KEYS
if rules == 0 or #ARGV ~= 3 + 5 * rules then
  return redis.error_reply('ERR tierlimit check: expected 3 + 5 arguments per key')
end

-- Every argument is read and checked before the first redis.call.
local seen = {}
for i = 1, rules do
  if seen[KEYS[i]] then
    refuse('check', 'KEYS[' .. i .. '] repeats KEYS[' .. seen[KEYS[i]] .. ']')
  end
  seen[KEYS[i]] = i
end
int_arg('check', 'now_us', ARGV[1], 0, MAX_EXACT)
local cost = int_arg('check', 'cost', ARGV[2], 1, MAX_LIMIT)
local nonce = ARGV[3]
if #nonce == 0 or #nonce > 64 then
  refuse('check', 'the nonce must be 1 to 64 bytes')
end
local args = {}
for i = 1, rules do
  local code, limit, period, capacity, offset = rule_args('check', 3 + 5 * (i - 1))
  if cost > capacity then
    refuse('check', 'cost ' .. ARGV[2] .. ' is above the capacity of rule ' .. i
      .. ': it could never be admitted')
  end
  args[i] = { code, limit, period, capacity, offset }
end

local now = script_now(ARGV[1])

local outcome = {}
local allowed = true
for i = 1, rules do
  local a = args[i]
  local code = a[1]
  -- A key holding another type fails its read here, before any commit, so
  -- nothing is written; the reply says which key.
  local read, ok, remaining, reset, retry, state, reset_now = pcall(CHECKS[code], KEYS[i], now,
    cost, a[2], a[3], a[4], a[5])
  if not read then
    local err = type(ok) == 'table' and ok.err or tostring(ok)
    if string.sub(err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE tierlimit check: KEYS[' .. i
        .. '] holds another type than algorithm ' .. code .. ' stores; nothing was written')
    end
    error(ok)
  end
  outcome[i] = { ok, remaining, reset, retry, state, reset_now, code }
  allowed = allowed and ok
end

local reply = { 0, 0, 0, now }
if allowed then
  reply[1] = 1
  local fewest = nil
  for i = 1, rules do
    local o = outcome[i]
    COMMITS[o[7]](KEYS[i], now, cost, nonce, o[5])
    if fewest == nil or o[2] < fewest then
      fewest = o[2]
      reply[2] = i - 1
    end
    reply[3 + 2 * i] = o[2]
    reply[4 + 2 * i] = o[3]
  end
else
  local longest = nil
  for i = 1, rules do
    local o = outcome[i]
    if o[1] then
      -- Passed, but nothing is committed: report it as it stands.
      reply[3 + 2 * i] = o[2] + cost
      reply[4 + 2 * i] = o[6]
    else
      if longest == nil or o[4] > longest then
        longest = o[4]
        reply[2] = i - 1
      end
      reply[3 + 2 * i] = o[2]
      reply[4 + 2 * i] = o[3]
    end
  end
  reply[3] = longest
end
return reply

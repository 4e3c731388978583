-- check.lua: checks one request against every rule of a rule set, all or nothing.
--
-- The main body of the check script. The Rust side prepends common.lua, the
-- algorithm files (gcra.lua, token_bucket.lua, sliding_log.lua, sliding_window.lua,
-- fixed_window.lua), which define <alg>_check and <alg>_commit, and
-- decide.lua, whose check_one makes the decision described here (shared with
-- check_batch.lua, which decides many requests in one call).
--
-- KEYS[i]  storage key of rule i: tl:{<escaped user key>}:<set>:<rule id>
--          (all rules share the hash tag, so one Cluster slot).
-- ARGV[1]  now in µs since the Unix epoch, or "0" to use the server's TIME.
-- ARGV[2]  cost: units this request takes from every rule (>= 1).
-- ARGV[3]  nonce: a random u64 per call, keeps sliding-log members unique.
-- ARGV[3 + i] rule i: its five numbers joined by ':', algorithm code (1 GCRA,
--          2 token bucket, 3 sliding log, 4 sliding window, 5 fixed window),
--          limit, period_us, capacity, utc_offset_us: "1:10:60000000:10:0"
--          (one argument, not five: Redis pays for each argument about as
--          much as for a few lines of Lua).
--
-- Reply: an array of integers, check_batch.lua's reply to a batch of this one
-- request:
--   one rule:   { now_us, retry_after_us (0: admitted), remaining,
--                 reset_after_us }
--   r rules:    { now_us, retry_after_us (0: admitted), deciding rule
--                 (0-based), then per rule i: remaining_i, reset_after_us_i }
-- A denial's retry-after is never 0, so it alone tells an admission. Each
-- integer of a reply costs Redis about as much as an argument, so the reply
-- holds nothing the caller can tell without it (one rule decides alone).
-- Deciding rule: when denied, the denying rule with the longest retry-after;
-- when allowed, the rule with the fewest remaining (ties: the lowest index).
-- When allowed, remaining_i and reset_after_us_i describe rule i after this
-- request; when denied nothing is written anywhere, and they describe rule i
-- as it stands (remaining_i = units it would admit now).
--
-- Every rule is checked first, without writing; only if all admit is each
-- committed. A denied request therefore changes no rule's state.
--
-- A key names the algorithm, period and UTC offset of its rule, not its limit
-- or capacity: a check with another limit or capacity than the last writer's
-- reads the same state and keeps what was used (GCRA rescales its arrival
-- time by the limit stored with it, the token bucket stores used units, the
-- window algorithms keep their counts), and judges it by the new numbers;
-- GCRA's and the token bucket's units drain at the limit they were written
-- under until an admission rewrites them (their key expires by that rate).
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
--   EVALSHA <sha> 1 tl:{user-1}:api:g60000000 0 1 42 1:10:60000000:10:0
--   -> 1) <now_us>  2) 0  3) 9  4) 6000000

if floor == nil then bind_std() end

local rules = #KEYS
if rules == 0 or #ARGV ~= 3 + rules then
  return redis.error_reply('ERR tierlimit check: expected 3 arguments and one per key')
end
-- One rule's reply comes as four values (see decide.lua), several rules' as
-- one table; an error raised on the way becomes its reply (request_error).
local ok, reply, retry, remaining, reset = pcall(check_one, 0, rules, 0)
if not ok then
  return request_error(reply)
elseif retry == nil then
  return reply
end
return { reply, retry, remaining, reset }

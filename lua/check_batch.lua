-- check_batch.lua: many requests in one call, each decided as check.lua
-- decides one, one after the other in the order given.
--
-- The main body of the batch script: the Rust side prepends common.lua, the
-- algorithm files and decide.lua (check_one). Request j sees every write of
-- requests 1 .. j-1, so a batch decides exactly what the same requests sent
-- one by one, in this order, would have been decided at the call's time (the
-- server's TIME, read once per call, or the caller's now).
--
-- KEYS     the storage keys of request 1, then those of request 2, ... (each
--          request's keys share one hash tag, so one Cluster slot; a batch
--          whose requests all share a slot may go to a Cluster node as is).
-- ARGV[1]  n, the number of requests (1 to 1000).
-- ARGV[2]  g, the number of distinct rule sets among them (1 to n): each
--          rule set's numbers are sent and checked once per call, not once
--          per request.
-- ARGV[3]  nonce, the call's (check.lua's ARGV[3]); request j's sliding-log
--          members carry "<nonce>.<j>", unique within the call too.
-- ARGV[4]  now_us, the call's ("0" for the server's TIME; check.lua's
--          ARGV[1]): every request is decided at it.
-- then per rule set s: its number of rules r_s (1 to 1000) and one
--          argument per rule (code:limit:period_us:capacity:utc_offset_us),
--          as check.lua takes them;
-- then per request j: its rule set s_j (1 to g; only when g > 1: with one
--          rule set every request is under it) and cost (check.lua's
--          ARGV[2]).
--
-- Each argument costs the server about as much as a few lines of Lua (Redis
-- parses it, makes an object of it and a Lua string), so a request carries
-- no more than it must: one argument with one rule set, two with more.
--
-- Reply: one flat array: the call's time in µs (the server's TIME or the
-- caller's now_us), then the n replies in order, each what check.lua would
-- have answered alone less that time, in a row:
--   one rule:   retry_after_us (0: admitted), remaining, reset_after_us;
--   r rules:    retry_after_us (0: admitted), deciding rule (0-based), then
--               per rule i: remaining_i, reset_after_us_i;
-- or in their place the one error reply check.lua would have answered (bad
-- input, a key of another type, a failed write). A request's error does not
-- stop the others. A denial's retry-after is never 0, so it alone tells an
-- admission. Every integer of a reply costs Redis about as much as an
-- argument (callgrind, 16 one-rule fixed-window requests per call: 3
-- integers each instead of 6 took a request from 45,800 to 43,500
-- instructions).
-- One array, not one per request: Redis turns each table of a reply into
-- RESP by first asking it for its special fields (err, ok, double, ...) and
-- then writing its length after its items (luaReplyToRedisReply in Redis'
-- script_lua.c). In stop 28's measurements a loop of 100 replies cost about
-- 0.8 µs per request as tables and 0.4 as one flat array, and a batch of 100
-- one-rule GCRA checks 10.3-11.8 µs per check before and 6.8-7.4 after
-- (benches/src/bin/script-parts.rs).
-- Keys and arguments that do not add up (the counts above against #KEYS and
-- #ARGV) refuse the whole call before anything is read or written:
-- "ERR tierlimit check batch: ...".
--
-- Example (redis-cli): two requests under one GCRA rule, 10 per minute:
--   EVALSHA <sha> 2 tl:{a}:api:g60000000 tl:{b}:api:g60000000 2 1 7 0
--     1 1:10:60000000:10:0   1   1
--   -> 1) <now_us>  2) 0  3) 9  4) 6000000  5) 0  6) 9  7) 6000000

if floor == nil then bind_std() end

local n = int_seen('check batch', 'the number of requests', ARGV[1], 1000)
local g = int_seen('check batch', 'the number of rule sets', ARGV[2], n)
local nonce = ARGV[3]
check_nonce('check batch', nonce)
local now = 0
if ARGV[4] ~= '0' then
  now = int_arg('check batch', 'now_us', ARGV[4], 0, MAX_EXACT)
end

-- Rule set s: { rules, args, nil, logs } once its numbers passed check.lua's
-- checks, logs being whether a rule is a sliding log (which needs a nonce of
-- its own per request); { rules, nil, error } when they did not (each of its
-- requests answers it).
local sets = {}
local a = 4
for s = 1, g do
  local rules = int_seen('check batch', 'the rules of rule set', ARGV[a + 1], 1000, s)
  local ok, args = pcall(rule_list, a + 1, rules)
  if ok then
    local logs = false
    for i = 1, rules do
      logs = logs or args[i][1] == 3
    end
    sets[s] = { rules, args, nil, logs }
  else
    sets[s] = { rules, nil, args }
  end
  a = a + 1 + rules
end

-- Each request names its rule set (when g > 1) by one of the texts '1' ..
-- g: looked up here, so only a request that names none pays for int_arg's
-- checks. Made only when g > 1 (a number made text costs Redis a sprintf).
local set_of = {}
if g > 1 then
  for s = 1, g do
    set_of[tostring(s)] = s
  end
end
-- Every request's keys and arguments, counted before anything is decided.
local k_end, a_end = 0, a
for j = 1, n do
  local s = 1
  if g > 1 then
    a_end = a_end + 1
    s = set_of[ARGV[a_end]] or int_arg('check batch', 'the rule set of request ' .. j, ARGV[a_end],
      1, g)
  end
  k_end = k_end + sets[s][1]
  a_end = a_end + 1
end
if k_end ~= #KEYS or a_end ~= #ARGV then
  return redis.error_reply('ERR tierlimit check batch: ' .. n .. ' requests name ' .. k_end
    .. ' keys and ' .. a_end .. ' arguments, but the call has ' .. #KEYS .. ' and ' .. #ARGV)
end

now = call_now(now)
local replies, o = { now }, 1
-- The request under way (j) and where the keys (k) and arguments (a) of the
-- requests before it end.
local j, k = 0, 0

-- Decides requests j + 1 .. n, each checked and decided as check.lua would
-- alone (its keys and cost first, then its rule set's numbers, then each
-- capacity), and adds each one's reply. A request that raises leaves j at it
-- and writes no reply: the loop below answers its error and runs the rest.
-- One pcall per batch, not per request, as long as no request raises: a
-- pcall costs about as much as a sixtieth of a batched check.
local function run()
  while j < n do
    j = j + 1
    local s = 1
    if g > 1 then
      a = a + 1
      s = set_of[ARGV[a]] or tonumber(ARGV[a])
    end
    local set = sets[s]
    local k0, rules, args = k, set[1], set[2]
    k, a = k + rules, a + 1
    if rules > 1 then
      check_keys(k0, rules)
    end
    -- int_seen, called only when the memo misses: a Lua call costs Redis
    -- about 1 % of a batched check.
    local cost_s = ARGV[a]
    local cost = INTS_SEEN and INTS_SEEN[cost_s] or int_seen('check', 'cost', cost_s, MAX_LIMIT)
    if args == nil then
      error(set[3])
    end
    for i = 1, rules do
      if cost > args[i][4] then
        refuse_capacity(cost_s, i)
      end
    end
    local request_nonce = nonce
    if set[4] then
      request_nonce = nonce .. '.' .. j
    end
    if rules == 1 then
      replies[o + 1], replies[o + 2], replies[o + 3] = decide_one(k0, args[1], now, cost,
        request_nonce)
      o = o + 3
    else
      o = decide(k0, rules, args, now, cost, request_nonce, replies, o)
    end
  end
end

while true do
  local ok, err = pcall(run)
  if ok then
    break
  end
  -- A request of several rules writes its reply in place as it goes: one
  -- that raised in a commit leaves items of its own, dropped here.
  for i = #replies, o + 1, -1 do
    replies[i] = nil
  end
  o = o + 1
  replies[o] = request_error(err)
end
return replies

-- decide.lua: one request against every rule of a rule set, all or nothing.
--
-- A fragment joined after common.lua and the algorithm files, in front of
-- check.lua (one request per call) and check_batch.lua (many requests per
-- call, decided one after the other), not a script of its own. The protocol,
-- the reply and the rules of a decision are check.lua's (see its header);
-- this file holds the decision so both scripts make it the same way.
--
-- KEYS / ARGV: none of its own; it defines (besides the argument checks
-- check_keys, check_call_args, int_seen, rule_list, check_nonce,
-- refuse_capacity and decide_one / decide, which check_batch.lua calls one by
-- one)
--   check_one(k0, rules, a0)  decides the request whose storage keys are
--                             KEYS[k0 + 1 .. k0 + rules] and whose arguments
--                             are ARGV[a0 + 1 ..]: now, cost, nonce, then one
--                             per rule (check.lua's ARGV[1 ..] shifted by a0).
--                             Returns check.lua's reply as a table, except
--                             for a set of one rule, whose four integers it
--                             returns as four values (no table of its own).
--                             Bad input raises refuse()'s error before any
--                             read; a key of another type raises WRONGTYPE
--                             from its read, before any write.
--   request_error(err)        the error reply of a request that raised err
--                             (the caller's pcall caught it).
--   call_now(now)             now, the caller's clock as check_call_args
--                             returned it; for 0, the server's TIME, read at
--                             most once per call: the requests of one batch
--                             are decided at one server time.
--
-- Example: check_one(0, #KEYS, 0) is check.lua's whole decision (its four
-- values made a table for a set of one rule).

-- <alg>_check(key, now, cost, limit, period, capacity, offset) returns ok,
-- remaining, reset_after_us, retry_after_us, reset_now_us and, when ok, its
-- state: at most five values, which <alg>_commit takes as they came.
local CHECKS = {
  gcra_check, token_bucket_check, sliding_log_check, sliding_window_check, fixed_window_check,
}
-- <alg>_commit(key, now, cost, nonce, rule, <state>) writes what its check
-- found; `rule` is the rule's { code, limit, period, capacity, offset }. The
-- state travels as values, not in a table: no table to make and collect on
-- every check.
local COMMITS = {
  gcra_commit, token_bucket_commit, sliding_log_commit, sliding_window_commit, fixed_window_commit,
}

-- Zeros to size a reply with (unpack): two per rule of MAX_RULES (16).
local ZEROS = {
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
}

local server_now = nil
local function call_now(now)
  if now == 0 then
    if server_now == nil then
      server_now = server_time()
    end
    return server_now
  end
  return now
end

-- Refuses a request whose keys repeat one another (one key under two
-- algorithms could not be committed whole). Called for sets of two rules or
-- more: one key cannot repeat itself. Compares each pair (at most 120, for
-- MAX_RULES = 16): Lua's strings are interned, so a comparison is one of
-- pointers. A table of the keys seen instead cost 1.8 % more of a three-rule
-- GCRA check (callgrind: 173.9k against 170.8k instructions).
local function check_keys(k0, rules)
  local keys = KEYS
  for i = k0 + 2, k0 + rules do
    local key = keys[i]
    for j = k0 + 1, i - 1 do
      if keys[j] == key then
        refuse('check', 'KEYS[' .. i .. '] repeats KEYS[' .. j .. ']')
      end
    end
  end
end

-- Checks `s` as a decimal integer from 1 to hi (at most MAX_LIMIT) for
-- `script`; returns it. A text seen before (common.lua's INTS_SEEN, when
-- memos are on) is a decimal integer of at least 1: only hi is left to
-- check. A refusal names `what`, followed by `which` when given (made only
-- then: a number made text costs Redis a sprintf).
local function int_seen(script, what, s, hi, which)
  local n = INTS_SEEN and INTS_SEEN[s]
  if n and n <= hi then
    return n
  end
  if which then
    what = what .. ' ' .. which
  end
  n = int_arg(script, what, s, 1, hi)
  if INTS_SEEN then
    if INTS_SEEN_N >= SEEN_MAX then
      INTS_SEEN, INTS_SEEN_N = {}, 0
    end
    INTS_SEEN[s], INTS_SEEN_N = n, INTS_SEEN_N + 1
  end
  return n
end

-- Checks a request's now and cost; returns the cost and the now (0: the
-- server's TIME), for call_now. The now is converted here, once: converting
-- its 16 digits again cost Redis 2.3k of a fixed-window check's 62.8k
-- instructions (callgrind, one check per call).
local function check_call_args(now_s, cost_s)
  -- "0" (the server's TIME) is by far the most common now.
  local now = 0
  if now_s ~= '0' then
    now = int_arg('check', 'now_us', now_s, 0, MAX_EXACT)
  end
  -- A few distinct costs serve almost every check: their memo is looked up
  -- here, int_seen called only when it misses (a Lua call costs Redis about
  -- 1 % of a check).
  return INTS_SEEN and INTS_SEEN[cost_s] or int_seen('check', 'cost', cost_s, MAX_LIMIT), now
end

-- The checked arguments of `rules` rules at ARGV[a + 1 ..] (check_batch.lua's
-- rule sets; raises what rule_args raises).
local function rule_list(a, rules)
  local list = {}
  for i = 1, rules do
    list[i] = rule_args('check', a + i)
  end
  return list
end

-- Checks a call's nonce (one per call: a batch's requests share it); an
-- argument is a string or, past the last one, nil.
local function check_nonce(script, nonce)
  if not nonce or #nonce == 0 or #nonce > 64 then
    refuse(script, 'the nonce must be 1 to 64 bytes')
  end
end

-- Refuses a cost above rule i's capacity: it could never be admitted. The
-- callers compare; this only says so.
local function refuse_capacity(cost_s, i)
  refuse('check', 'cost ' .. cost_s .. ' is above the capacity of rule ' .. i
    .. ': it could never be admitted')
end

-- The storage key (its index in KEYS) and algorithm of the rule whose read
-- is under way, 0 between reads: a key of another type fails its read with
-- WRONGTYPE, raised, and request_error names the key from these. Reads come
-- before any commit, so such a request wrote nothing.
local reading_key, reading_code = 0, 0

-- The reply of a request that raised `err`, as a lone call would answer it:
-- refuse()'s error as it is, a failed read's WRONGTYPE naming its key, any
-- other command's error with its own code, anything else (a bug) as "ERR".
-- check.lua decides its request under one pcall, check_batch.lua all its
-- requests under one (and one more after each request that raises), not one
-- per request and per rule read: each pcall costs Redis about 1.7 % of a
-- batched check (callgrind, stop 32).
local function request_error(err)
  local text = type(err) == 'table' and err.err or tostring(err)
  local key = reading_key
  reading_key = 0
  if key > 0 and sub(text, 1, 9) == 'WRONGTYPE' then
    return { err = 'WRONGTYPE tierlimit check: KEYS[' .. key .. '] holds another type than'
      .. ' algorithm ' .. reading_code .. ' stores; nothing was written' }
  elseif type(err) == 'table' and err.err then
    return err
  elseif match(text, '^%u+ ') then
    -- A command's error raised through pcall may be its bare reply text
    -- ("OOM command not allowed ..."): keep its code, as a lone call would.
    return { err = text }
  end
  return { err = 'ERR tierlimit check: ' .. text }
end

-- decide() for a rule set of one rule (the common case), without the
-- per-rule tables: its reply less the server time (the rule being the
-- deciding one) as three values instead of a table: retry-after (0:
-- admitted), remaining, reset-after.
local function decide_one(k0, a, now, cost, nonce)
  local code = a[1]
  local key = KEYS[k0 + 1]
  reading_key, reading_code = k0 + 1, code
  local ok, remaining, reset, retry, _, s1, s2, s3, s4, s5 = CHECKS[code](key, now, cost, a[2],
    a[3], a[4], a[5])
  reading_key = 0
  if ok then
    COMMITS[code](key, now, cost, nonce, a, s1, s2, s3, s4, s5)
    return 0, remaining, reset
  end
  return retry, remaining, reset
end

-- Check results of a request's rules, OUTCOME[i] rule i's, and the rules'
-- arguments of a lone request (check_one): scratch tables every request
-- reuses, so each grows once per library load instead of once per request.
-- A request reads no slot it did not write.
local OUTCOME, ARGS = {}, {}

-- Decides a request of two rules or more whose arguments passed the checks
-- above: args[i] holds rule i's { code, limit, period, capacity, offset }.
-- Writes its reply less the server time into out[o + 1 ..] (retry-after, 0
-- when admitted; the deciding rule; each rule's remaining and reset-after),
-- in order, and returns the index of its last item: a batch's reply takes
-- it in place, with no table of the request's own.
local function decide(k0, rules, args, now, cost, nonce, out, o)
  local allowed = true
  for i = 1, rules do
    local a = args[i]
    local code = a[1]
    local key = KEYS[k0 + i]
    -- A key holding another type fails its read here, before any commit, so
    -- nothing is written; request_error says which key.
    reading_key, reading_code = k0 + i, code
    local ok, remaining, reset, retry, reset_now, s1, s2, s3, s4, s5 = CHECKS[code](key, now, cost,
      a[2], a[3], a[4], a[5])
    OUTCOME[i] = { ok, remaining, reset, retry, reset_now, code, s1, s2, s3, s4, s5 }
    allowed = allowed and ok
  end
  reading_key = 0

  out[o + 1], out[o + 2] = 0, 0
  if allowed then
    local fewest = nil
    for i = 1, rules do
      local r = OUTCOME[i]
      COMMITS[r[6]](KEYS[k0 + i], now, cost, nonce, args[i], r[7], r[8], r[9], r[10], r[11])
      if fewest == nil or r[2] < fewest then
        fewest = r[2]
        out[o + 2] = i - 1
      end
      out[o + 1 + 2 * i] = r[2]
      out[o + 2 + 2 * i] = r[3]
    end
  else
    local longest = nil
    for i = 1, rules do
      local r = OUTCOME[i]
      if r[1] then
        -- Passed, but nothing is committed: report it as it stands.
        out[o + 1 + 2 * i] = r[2] + cost
        out[o + 2 + 2 * i] = r[5]
      else
        if longest == nil or r[4] > longest then
          longest = r[4]
          out[o + 2] = i - 1
        end
        out[o + 1 + 2 * i] = r[2]
        out[o + 2 + 2 * i] = r[3]
      end
    end
    out[o + 1] = longest
  end
  return o + 2 + 2 * rules
end

local function check_one(k0, rules, a0)
  -- Every argument is read and checked before the first redis.call.
  if rules > 1 then
    check_keys(k0, rules)
  end
  local cost, now = check_call_args(ARGV[a0 + 1], ARGV[a0 + 2])
  check_nonce('check', ARGV[a0 + 3])
  if rules == 1 then
    -- No table of one rule's arguments (most sets have one rule).
    local rule = rule_args('check', a0 + 4)
    if cost > rule[4] then
      refuse_capacity(ARGV[a0 + 2], 1)
    end
    now = call_now(now)
    return now, decide_one(k0, rule, now, cost, ARGV[a0 + 3])
  end
  for i = 1, rules do
    local rule = rule_args('check', a0 + 3 + i)
    if cost > rule[4] then
      refuse_capacity(ARGV[a0 + 2], i)
    end
    ARGS[i] = rule
  end
  now = call_now(now)
  -- Made at its full size (up to MAX_RULES' rules): grown item by item, it
  -- would be copied thrice for three rules.
  local reply = { now, 0, 0, unpack(ZEROS, 1, min(2 * rules, #ZEROS)) }
  decide(k0, rules, ARGS, now, cost, ARGV[a0 + 3], reply, 1)
  return reply
end

-- sliding_log.lua: a sliding window log, one rule.
--
-- A fragment of the check and reconcile scripts (see check.lua), not a script of its own.
--
-- KEYS: the rule's storage key (KEYS[i] of check.lua).
-- ARGV: the rule's arguments from check.lua: limit, period_us (capacity is the
--       limit; no UTC offset). The request's nonce makes members unique:
--       the call's (ARGV[3] of check.lua), or in a batch the call's and the
--       request's number, "<nonce>.<j>" (check_batch.lua).
-- Reply: sliding_log_check returns ok, remaining, reset_after_us,
--        retry_after_us, reset_now_us (reset_after as things stand, before
--        this request), then when ok the state sliding_log_commit needs:
--        period_us, keep_until_us and now - period_us as text (the score
--        at and below which units have left the window).
--
-- State: a sorted set with one member per admitted unit, scored by its time
-- in µs since the Unix epoch; a unit counts while now < score + period. Exact
-- over every trailing period; memory grows with the limit. Members are
-- "<now>:<nonce>:<j>", unique even when many requests share a microsecond.
-- The check only reads (ZCOUNT); the commit prunes what has left the window,
-- adds the units and sets the TTL to when the newest unit leaves.
--
-- Work bound: a commit adds `cost` members and prunes at most `limit`, and
-- reconcile.lua adds at most `limit`; the limit is at most
-- MAX_SLIDING_LOG_LIMIT (1000, common.lua; tierlimit_core's
-- MAX_SLIDING_LOG_LIMIT), so no call does more than a few thousand member
-- operations: milliseconds of server time (measured in
-- crates/tierlimit-redis/tests/script_work.rs).
--
-- Example: on an empty key, sliding_log_check(key, now, 1, 10, 60000000)
-- returns true, 9, 60000000, 0, 0, 60000000, now, "<now - 60000000>":
-- admitted, 9 left, the unit leaves the log in 60 s.

-- Members per ZADD, far below Lua's limit on unpack()ed arguments.
local SLIDING_LOG_BATCH = 500

-- The score of the newest unit in the log (the key must not be empty). The
-- indexes are strings: Redis turns a Lua number argument into text on every
-- call, which cost 0.2 µs more for the two (7.0, a loop of 200,000 ZRANGEs).
-- A score is always a number's text, so arithmetic converts it (once, where
-- tonumber would twice).
local function sliding_log_newest(key)
  local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  return newest[2] + 0
end

local function sliding_log_check(key, now, cost, limit, period)
  local gone = format('%d', now - period)
  local since = '(' .. gone
  local count = redis.call('ZCOUNT', key, since, '+inf')
  local newest = nil
  local reset_now = 0
  if count > 0 then
    newest = sliding_log_newest(key)
    reset_now = max(0, newest + period - now)
  end
  if count + cost <= limit then
    local keep_until = now
    if newest and newest > now then
      -- A member from a client clock ahead of ours: keep the key for it.
      keep_until = newest
    end
    return true, limit - count - cost, keep_until + period - now, 0, reset_now,
      period, keep_until, gone
  end
  -- Denied: the (count + cost - limit) oldest units must leave first.
  local entry = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES',
    'LIMIT', format('%d', count + cost - limit - 1), 1)
  local retry = max(1, entry[2] + period - now)
  return false, max(0, limit - count), reset_now, retry, reset_now
end

local function sliding_log_commit(key, now, cost, nonce, rule, period, keep_until, gone)
  local score = format('%d', now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', gone)
  local prefix = score .. ':' .. nonce .. ':'
  if cost == 1 then
    -- Most requests: one member, without a table to unpack.
    redis.call('ZADD', key, score, prefix .. 1)
  else
    local args = {}
    for j = 1, cost do
      args[#args + 1] = score
      args[#args + 1] = prefix .. j
      if #args >= 2 * SLIDING_LOG_BATCH or j == cost then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
  end
  redis.call('PEXPIRE', key,
    format('%d', max(1, ceil((keep_until + period - now) / 1000))))
end

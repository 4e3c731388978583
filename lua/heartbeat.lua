-- heartbeat.lua: records that one limiter instance is alive and counts the
-- live ones, so each instance can size its local fallback to its share.
-- The Rust side prepends common.lua (script_now).
--
-- KEYS[1]  a sorted set of instance ids scored by when they stop counting
--          (µs since the Unix epoch).
-- ARGV[1]  now in µs since the Unix epoch, or "0" to use the server's TIME.
-- ARGV[2]  this instance's id.
-- ARGV[3]  ttl_us: how long this heartbeat keeps the instance counted.
--
-- Reply: the number of live instances, this one included (an integer).
--
-- Expired ids are removed on every call, and the set itself expires with its
-- longest-lived member, so a group whose instances all stopped leaves nothing.
--
-- Example: EVALSHA <sha> 1 tl:{instances}:default 0 9f3c-412 3000000 -> 3
-- (three instances have beaten within their TTL).

if floor == nil then bind_std() end

local now = script_now(ARGV[1])
local ttl = tonumber(ARGV[3])
if ttl == nil or ttl < 1 then
  return redis.error_reply('ERR tierlimit heartbeat: ttl_us must be a positive integer')
end

redis.call('ZADD', KEYS[1], format('%d', now + ttl), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', format('%d', now))
local last = redis.call('ZRANGE', KEYS[1], '-1', '-1', 'WITHSCORES')
local keep_us = tonumber(last[2]) - now
redis.call('PEXPIRE', KEYS[1], format('%d', max(1, ceil(keep_us / 1000))))
return redis.call('ZCARD', KEYS[1])

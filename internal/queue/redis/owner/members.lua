-- The live workers, and P: run by Manager.heartbeat (members.go) every
-- balance pass, and by RecordPartitions (with no worker).
--
-- KEYS[1]  the partition count Redis records (string; never expires)
-- KEYS[2]  the live workers (zset: worker id -> when its heartbeat runs
--          out, ms of the server's clock)
-- ARGV[1]  the caller's partition count
-- ARGV[2]  the worker's id ("": only record or check P)
-- ARGV[3]  heartbeat ttl (ms)
--
-- Records ARGV[1] if no count is recorded. Drops the workers whose
-- heartbeat ran out; adds or refreshes this one, unless the counts differ
-- (a worker hashing tenants another way must own nothing).
--
-- Returns {recorded count, live worker id, ...}, ids in no given order.
local recorded = redis.call('GET', KEYS[1])
if not recorded then
  redis.call('SET', KEYS[1], ARGV[1])
  recorded = ARGV[1]
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if ARGV[2] ~= '' and tonumber(recorded) == tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
end
local out = {tonumber(recorded) or -1}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  out[#out + 1] = id
end
return out

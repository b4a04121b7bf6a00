-- Records an attempt at a job's callback: Store.CallbackAttempted
-- (callbacks.go). Microseconds.
--
-- KEYS[1]  the job's hash
-- KEYS[2]  the partition's callbacks (zset: id -> when next due)
-- ARGV[1]  the job's id
-- ARGV[2]  'delivered', 'failed' (given up) or 'retry'
-- ARGV[3]  what went wrong ('' delivered)
-- ARGV[4]  retry: when it is next due
--
-- Returns 1, or 0 if the job owes no pending callback.

if redis.call('HGET', KEYS[1], 'cbs') ~= 'pending' then return 0 end
redis.call('HINCRBY', KEYS[1], 'cba', 1)
if ARGV[2] == 'retry' then
  redis.call('HSET', KEYS[1], 'cbe', ARGV[3], 'cbn', ARGV[4])
  redis.call('ZADD', KEYS[2], tonumber(ARGV[4]), ARGV[1])
else
  redis.call('HSET', KEYS[1], 'cbs', ARGV[2], 'cbe', ARGV[3])
  redis.call('HDEL', KEYS[1], 'cbn')
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1

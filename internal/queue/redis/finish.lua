-- Records an attempt that ended the job (sent and answered 2xx, or failed
-- for good): the common outcomes, in one round trip. Outcomes that change
-- the tenant's schedule (a retry, a pushback, a release) go through the Go
-- rule instead (queue.ApplyOutcome, in Store.finishByRule). Run by
-- Store.finishDone (outcome.go). Microseconds.
--
-- KEYS[1]  the job's hash
-- KEYS[2]  its tenant's hash
-- KEYS[3]  the shard's in-flight zset
-- KEYS[4]  the shard's active-tenants zset
-- KEYS[5]  the tenant's failed zset
-- KEYS[6]  its idempotency key's key (its hash again if none)
-- KEYS[7]  the tenant's claimed jobs (zset: id -> slot)
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  the task's id
-- ARGV[3]  state: 'succeeded' | 'failed'
-- ARGV[4]  sent at (0: not sent)
-- ARGV[5]  status
-- ARGV[6]  error
-- ARGV[7]  retention (ms)
-- ARGV[8]  idle ttl (ms)
--
-- Returns 1, or 0 if the job is no longer this task's to finish (its
-- worker's lease ran out and another took it).

local now = server_now(ARGV[1])
local retention = tonumber(ARGV[7])
local j = redis.call('HMGET', KEYS[1], 'state', 'task', 'tenant', 'id', 'sent', 'status', 'slot')
if j[1] ~= 'dispatching' or j[2] ~= ARGV[2] then return 0 end
local state, tenant, id = ARGV[3], j[3], j[4]
local sent, status = ARGV[4], ARGV[5]
if sent == '0' then sent = j[5] or '0' end
if status == '0' then status = j[6] or '0' end
redis.call('HSET', KEYS[1], 'state', state, 'fin', now, 'sent', sent, 'status', status, 'err', ARGV[6])
redis.call('PEXPIRE', KEYS[1], retention)
redis.call('PEXPIRE', KEYS[6], retention)
redis.call('ZREM', KEYS[3], id)
leave_claimed(KEYS[7], tonumber(j[7]) or 0, tenant_time(KEYS[2], now), tonumber(ARGV[8]))
redis.call('HINCRBY', KEYS[2], 'inflight', -1)
if state == 'succeeded' then
  redis.call('HINCRBY', KEYS[2], 'delivered', 1)
else
  redis.call('HINCRBY', KEYS[2], 'failed', 1)
  redis.call('ZADD', KEYS[5], now, id)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - retention * 1000)
  redis.call('PEXPIRE', KEYS[5], retention)
end
inactive(KEYS[4], tenant)
settle(KEYS[2], now, tonumber(ARGV[8]))
return 1

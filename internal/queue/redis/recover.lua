-- Takes back the jobs of workers that died holding them (waiting for their
-- slot, or mid-attempt): their lease in the in-flight set ran out (a live
-- worker renews it). Each job gets a new task id, due at once (its claim
-- says how long to wait); asynq's own recovery of the dead worker's task, a
-- minute or two later, then finds a task that no longer carries it. An
-- attempt may have been sent: the retry carries the same Idempotency-Key.
-- Run by the recoverer (recoverer.go). Microseconds.
--
-- KEYS[1]  the shard's in-flight zset (job id -> lease end)
-- KEYS[2]  the shard's hand-off zset (the new tasks go through it)
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  the shard's key prefix (shardKeys.tag)
-- ARGV[3]  the most jobs to take back
--
-- Returns {{job id, task id, tenant}, ...}: the tasks to make.

local now = server_now(ARGV[1])
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  -- Keys in the shard's hash tag: the same slot as KEYS.
  local jk = ARGV[2] .. 'job:' .. id
  local j = redis.call('HMGET', jk, 'state', 'tenant', 'slot')
  if j[1] == 'dispatching' or j[1] == 'queued' or j[1] == 'retrying' then
    local task = id .. '.' .. redis.call('HINCRBY', jk, 'lives', 1)
    redis.call('HSET', jk, 'task', task)
    if j[1] == 'dispatching' then
      redis.call('HSET', jk, 'state', 'retrying')
      local tk = ARGV[2] .. 'tenant:' .. j[2]
      redis.call('HINCRBY', tk, 'inflight', -1)
      redis.call('HINCRBY', tk, 'depth', 1)
      redis.call('ZREM', ARGV[2] .. 'claimed:' .. j[2], id)
      redis.call('ZADD', ARGV[2] .. 'waiting:' .. j[2], tonumber(j[3]) or 0, id)
    end
    redis.call('ZADD', KEYS[2], now, id)
    out[#out + 1] = {id, task, j[2] or ''}
  end
end
return out

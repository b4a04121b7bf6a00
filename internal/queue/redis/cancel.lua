-- Cancels a waiting job: Store.Cancel (job.go). Microseconds.
--
-- KEYS[1]  the job's hash
-- KEYS[2]  its tenant's hash
-- KEYS[3]  the partition's active-tenants zset
-- KEYS[4]  its idempotency key's key (its hash again if none)
-- KEYS[5]  the tenant's waiting jobs (zset: id -> slot)
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  retention (ms)
-- ARGV[3]  the tenant's interval
-- ARGV[4]  '1' if the last job of the schedule gives its place back
--          (burst 1, no windows)
-- ARGV[5]  idle ttl (ms)
--
-- Returns {code, state, finished_at}: code 0 no such job, 1 not waiting
-- (state says what it is), 2 cancelled (at finished_at).

local now = server_now(ARGV[1])
local j = redis.call('HMGET', KEYS[1], 'state', 'slot', 'cost', 'tenant', 'id')
if not j[1] then return {0, '', 0} end
if j[1] ~= 'queued' and j[1] ~= 'retrying' and j[1] ~= 'scheduled' then return {1, j[1], 0} end
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #('job:' .. j[5]))
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'fin', now)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[2]))
if j[1] == 'scheduled' then -- booked for its not_before: counted apart
  redis.call('HINCRBY', KEYS[2], 'scheduled', -1)
  redis.call('ZREM', prefix .. 'sched:' .. j[4], j[5])
else
  redis.call('HINCRBY', KEYS[2], 'depth', -1)
end
redis.call('HINCRBY', KEYS[2], 'cancelled', 1)
-- A booked retry is not in the schedule's line: it gives back its booking
-- only.
if not booked_drop(KEYS[2], j[5]) and ARGV[4] == '1' then
  -- So that cancelling does not leave the queue looking fuller than it
  -- is. (Only the last: a place in the middle is already spaced around.)
  local slot = tonumber(j[2])
  local tat = tonumber(redis.call('HGET', KEYS[2], 'tat') or 0)
  if tat == slot + (tonumber(j[3]) or 1) * tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[2], 'tat', slot)
  end
end
-- Its owner, if it has it in its schedule, drops it at its claim.
redis.call('ZREM', KEYS[5], j[5])
inactive(KEYS[3], j[4])
settle(KEYS[2], now, tonumber(ARGV[5]))
owe_callbacks(prefix, {j[5]}, now)
tell_finished({j[5]})
return {2, 'cancelled', now}

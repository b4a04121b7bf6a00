-- Takes a due job for one attempt, for the asynq task that carries it:
-- atomically, so that asynq's early starts, repeats and many workers hand
-- each attempt to one worker only. Run by Store.claim (claim.go).
-- Microseconds.
--
-- KEYS[1]  the job's hash
-- KEYS[2]  its tenant's hash
-- KEYS[3]  the shard's hand-off zset
-- KEYS[4]  the shard's active-tenants zset
-- KEYS[5]  the shard's in-flight zset (job id -> lease end)
-- KEYS[6]  the tenant's waiting jobs (zset: id -> slot)
-- KEYS[7]  the tenant's claimed jobs (zset: id -> slot)
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  the task's id
-- ARGV[3]  horizon: claim this long before the job's dispatch time
-- ARGV[4]  lease
-- ARGV[5]  retention (ms)
-- ARGV[6]  held recheck: how soon a held tenant's job looks again
-- ARGV[7]  the longest wait the worker holds the task for (longer: it hands
--          the task back to asynq)
-- ARGV[8]  the shard's key prefix (shardKeys.tag)
-- ARGV[9]  idle ttl (ms)
--
-- A job whose task a worker holds, waiting or sending, is in the in-flight
-- set under a lease the worker renews: if the worker dies, recover.lua
-- gives the job a new task at once, not asynq's minute or two later.
--
-- Returns {code, wait, dispatch_at, now, field, value, ...}, code one of
--   0  drop the task: the job is gone, done, or carried by another task
--   1  not yet: come back in wait
--   2  claimed: its dispatch time, and the job's hash as field-value pairs
--   3  expired: its deadline comes first
--   4  another worker has it (leased): not before wait
--   5  its tenant is held: look again in wait

local now = server_now(ARGV[1])
local horizon, lease, holdmax = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[7])

local j = redis.call('HMGET', KEYS[1], 'state', 'task', 'slot', 'deadline', 'tenant', 'id', 'key', 'attempts')
local state, task, tenant, jobid = j[1], j[2], j[5], j[6]
local function reply(code, wait, dispatch_at) return {code, wait or 0, dispatch_at or 0, now} end
if not state or task ~= ARGV[2] then return reply(0) end

-- Not yet: the worker holds the task (under a lease) or hands it back.
local function later(wait, code)
  if wait <= holdmax then
    redis.call('ZADD', KEYS[5], now + lease, jobid)
  else
    redis.call('ZREM', KEYS[5], jobid)
  end
  return reply(code or 1, wait)
end

if state == 'dispatching' then
  -- Another worker has it, unless its lease ran out (it crashed): then
  -- this task takes it over (the attempt may have been sent: the same
  -- Idempotency-Key goes again).
  local lease_end = tonumber(redis.call('ZSCORE', KEYS[5], jobid) or 0)
  if lease_end > now then return reply(4, lease_end - now) end
  redis.call('HINCRBY', KEYS[2], 'inflight', -1)
  redis.call('HINCRBY', KEYS[2], 'depth', 1)
  redis.call('HSET', KEYS[1], 'state', 'retrying')
  redis.call('ZREM', KEYS[7], jobid)
  redis.call('ZADD', KEYS[6], tonumber(j[3]), jobid)
elseif state ~= 'queued' and state ~= 'retrying' then
  redis.call('ZREM', KEYS[5], jobid)
  return reply(0)
end

local slot = tonumber(j[3])
-- '' or none: no deadline; '0' too, written for none by builds before this
-- one (no job is kept with a deadline at 1970 exactly: its admission
-- refuses it). Any other number is a deadline.
local deadline = tonumber(j[4])
if deadline == 0 then deadline = nil end
local h = redis.call('HMGET', KEYS[2], 'shift', 'until', 'held')
local shift, untl, held = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
if held > 0 then
  -- Held by an operator: look again at the next multiple of the recheck,
  -- the same for every job of the tenant, plus the job's place in the
  -- schedule: after a resume they come back in slot order (a resume is
  -- seen within the recheck).
  local frozen = at_least(untl, held) - shift
  local recheck = tonumber(ARGV[6])
  return later(recheck - now % recheck + at_least(0, slot - frozen), 5)
end
local dispatch_at = at_least(untl, slot + shift)

if deadline and dispatch_at > deadline then
  redis.call('HSET', KEYS[1], 'state', 'expired', 'fin', now,
    'err', 'expired: its deadline passed before it could be sent')
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
  if j[7] and j[7] ~= '' then redis.call('PEXPIRE', idem_key(ARGV[8], tenant, j[7]), tonumber(ARGV[5])) end
  redis.call('HINCRBY', KEYS[2], 'depth', -1)
  redis.call('HINCRBY', KEYS[2], 'expired', 1)
  redis.call('ZREM', KEYS[3], jobid)
  redis.call('ZREM', KEYS[5], jobid)
  redis.call('ZREM', KEYS[6], jobid)
  inactive(KEYS[4], tenant)
  settle(KEYS[2], now, tonumber(ARGV[9]))
  return reply(3)
end
if deadline and dispatch_at - now > horizon and deadline - now < dispatch_at - now - horizon then
  return later(deadline - now) -- look again when it expires
end
if dispatch_at - now > horizon then return later(dispatch_at - now - horizon) end

redis.call('HSET', KEYS[1], 'state', 'dispatching', 'dispatch', dispatch_at, 'attempts', (tonumber(j[8]) or 0) + 1)
redis.call('HINCRBY', KEYS[2], 'depth', -1)
redis.call('HINCRBY', KEYS[2], 'inflight', 1)
redis.call('ZREM', KEYS[3], jobid)
redis.call('ZADD', KEYS[5], now + lease, jobid)
redis.call('ZREM', KEYS[6], jobid)
redis.call('ZADD', KEYS[7], slot, jobid)
local out = reply(2, 0, dispatch_at)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out

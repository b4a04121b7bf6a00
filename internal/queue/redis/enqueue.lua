-- Admits a batch of one tenant's jobs, in order, and keeps those admitted:
-- the Redis backend's Enqueue (and Retry) in one round trip. Each decision
-- is admit.lua's (loaded before this file as the function admit_decision,
-- see redis_scripts.go); around it, the idempotency key, the job's hash,
-- the hand-off set (jobs not yet known to be asynq tasks) and the tenant's
-- expiry. Microseconds, like admit.lua.
--
-- KEYS  1 tenant hash, 2 hand-off zset, 3 active-tenants zset, 4 the
--       tenant's failed zset, 5.. one list per window, then per job: its
--       hash, and its idempotency key (its hash again if none)
-- ARGV  1 now (0: the server's TIME), 2 lag, 3 interval, 4 burst,
--       5 capacity, 6 number of windows, then n and length per window,
--       then idle ttl (ms), mode ('new', or 'retry' for a failed job sent
--       again), the tenant's name, then per job: id, task id, payload,
--       idempotency key ('' none), cost, deadline (0 none)
--
-- Returns per job admit.lua's answer (for a retry admitted, with its new
-- task id last), {2, id} for a repeated idempotency key, or {4, state} for
-- a retry of a job that is not failed.

local nw = tonumber(ARGV[6])
local a = 7 + 2 * nw
local idle_ms, mode, tenant = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
local T = tonumber(ARGV[3])

local now = server_now(ARGV[1])

local akeys = {KEYS[1]}
for i = 1, nw do akeys[#akeys + 1] = KEYS[4 + i] end

-- Keeps k at least ms more.
local function keep(k, ms)
  local cur = redis.call('PTTL', k)
  if cur == -1 or (cur >= 0 and cur < ms) then redis.call('PEXPIRE', k, ms) end
end

local out = {}
local longest = 0 -- the latest dispatch time admitted, and its cost
for j = 0, (#ARGV - a - 2) / 6 - 1 do
  local b = a + 3 + j * 6
  local id, task, payload, key = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local cost, deadline = tonumber(ARGV[b + 4]), ARGV[b + 5]
  local jk, ik = KEYS[5 + nw + j * 2], KEYS[6 + nw + j * 2]
  local r
  if key ~= '' and redis.call('GET', ik) then
    r = {2, redis.call('GET', ik)}
  elseif mode == 'retry' and redis.call('HGET', jk, 'state') ~= 'failed' then
    r = {4, redis.call('HGET', jk, 'state') or ''}
  else
    local aargv = {now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], cost, -1, '1', deadline}
    for i = 1, 2 * nw do aargv[#aargv + 1] = ARGV[6 + i] end
    r = admit_decision(akeys, aargv)
  end
  if r[1] == 0 then
    redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  elseif r[1] == 1 then
    local slot, dispatch_at, depth = r[2], r[3], r[5]
    if mode == 'retry' then
      -- A new task id: the failed one's task is gone, and a task id may
      -- not come back while asynq remembers it.
      task = id .. '.' .. redis.call('HINCRBY', jk, 'lives', 1)
      r[8] = task
      redis.call('HSET', jk, 'state', 'queued', 'slot', slot, 'task', task, 'attempts', 0,
        'failures', 0, 'fin', 0)
      redis.call('PERSIST', jk)
      redis.call('PERSIST', ik)
      redis.call('ZREM', KEYS[4], id)
    else
      redis.call('HSET', jk, 'id', id, 'tenant', tenant, 'state', 'queued', 'payload', payload, 'key', key,
        'cost', cost, 'deadline', deadline, 'enq', now, 'slot', slot, 'task', task,
        'delay', dispatch_at - now, 'depth', depth + 1, 'prompt', r[7], 'attempts', 0, 'failures', 0)
      -- Kept while the job is, and store.retention after it finishes.
      if key ~= '' then redis.call('SET', ik, id) end
    end
    if mode ~= 'retry' then redis.call('HINCRBY', KEYS[1], 'accepted', 1) end
    redis.call('ZADD', KEYS[2], now, id)
    redis.call('ZINCRBY', KEYS[3], 1, tenant)
    longest = math.max(longest, dispatch_at - now + cost * T)
  end
  out[#out + 1] = r
end

-- The tenant's state lives while it has jobs; a refusal alone never makes
-- it outlive its idle time. Its windows' bookkeeping, as long as it counts.
settle(KEYS[1], now, idle_ms)
if longest > 0 then
  for i = 1, nw do
    keep(KEYS[4 + i], math.floor((longest + tonumber(ARGV[6 + 2 * i])) / 1000) + idle_ms)
  end
end
return out

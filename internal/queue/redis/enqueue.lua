-- Admits a batch of one tenant's jobs, in order, and keeps those admitted:
-- the Redis backend's Enqueue (and Retry) in one round trip, run by
-- enqueue.go. Each decision is admit.lua's (loaded before this file as the
-- function admit_decision); around it, the idempotency key, the job's hash,
-- the line that tells the partition's owner of it (its arrivals) and the
-- tenant's expiry. Microseconds, like admit.lua.
--
-- KEYS[1]      the tenant's hash
-- KEYS[2]      the partition's arrivals (a list: "id dispatch_at tenant")
-- KEYS[3]      the partition's active-tenants zset
-- KEYS[4]      the tenant's failed zset
-- KEYS[5]      the tenant's waiting jobs (zset: id -> slot)
-- KEYS[6]      the tenant's claimed jobs (zset: id -> slot)
-- KEYS[7]      the partition's lease (owner.LeaseKey)
-- KEYS[8]      the partition's epoch (owner.EpochKey)
-- KEYS[9..]    one list per window (nw of them), then per job: its hash,
--              and its idempotency key's key (its hash again if none)
-- ARGV[1]      now (0: the server's TIME)
-- ARGV[2]      lag
-- ARGV[3]      interval
-- ARGV[4]      burst
-- ARGV[5]      capacity
-- ARGV[6]      the downstream ceiling's interval (0: none)
-- ARGV[7]      the downstream ceiling's burst
-- ARGV[8]      idle ttl (ms)
-- ARGV[9]      mode: 'new', or 'retry' for a failed job sent again
-- ARGV[10]     the tenant's name
-- ARGV[11]     the partition's key prefix (partKeys.tag)
-- ARGV[12]     nw, the number of windows
-- ARGV[13]     the lease: how long a partition new to Redis is held vacant
-- ARGV[14]     how long after its lease is taken a new owner sends
-- ARGV[15..]   n and length per window
-- then per job id, payload, idempotency key ('' none), cost, deadline
--              ('' none), request (its JSON, '' none: then the hash has
--              no 'request' field), type ('' none: no 'type' field),
--              callback URL ('' none: no 'cbu' field), the final
--              states it tells (comma-separated, '' all four: 'cbon'),
--              its not_before (0 none), the tenant's max_scheduled and
--              '1' if it has a cap on attempts in flight (admit.lua's
--              NOT_BEFORE, MAX_SCHEDULED, CAPPED)
--
-- Returns one reply per job, each
--   {code, slot, dispatch_at, delay, retry_after, depth, now, prompt,
--    shift, until, held, field, value, ...}
-- code 1 admitted, 0 refused, 3 would expire, 5 schedule full (the
-- field-value pairs: 'scheduled' and the count), 6 admitted booked for
-- its not_before (admit.lua's), 2 a repeated idempotency key, 4 a retry
-- of a job that is not failed; slot,
-- dispatch_at, delay, retry_after, depth, prompt as admit.lua's; shift,
-- until, held the
-- tenant's pause and the field-value pairs the first job's hash without
-- its payload (a repeat), or its state (4).

local T = tonumber(ARGV[3])
local idle_ms, mode, tenant, prefix = tonumber(ARGV[8]), ARGV[9], ARGV[10], ARGV[11]
local nw = tonumber(ARGV[12])
local a = 15 + 2 * nw -- the first job's arguments

local now = server_now(ARGV[1])

local akeys = {KEYS[1], KEYS[5], KEYS[6]}
for i = 1, nw do akeys[#akeys + 1] = KEYS[8 + i] end

-- When the partition's owner starts sending (0: it has one, as far as
-- Redis can tell): a partition held vacant (new to Redis, or Redis lost
-- its data) at the vacancy's end; one Redis has never seen a lease after
-- its first worker's look, which is now for a worker running. Its owner
-- then sends the jobs overdue from then on (takeover.lua), and
-- admit_decision promises that (DESIGN.md section 6c). An owner that died
-- is not known here: its heartbeat lapses with its lease.
local owner_at = 0
local lease = redis.call('GET', KEYS[7])
if lease == '' then
  owner_at = now + at_least(redis.call('PTTL', KEYS[7]), 0) * 1000 + tonumber(ARGV[14])
elseif not lease and redis.call('EXISTS', KEYS[8]) == 0 then
  owner_at = now + tonumber(ARGV[13]) + tonumber(ARGV[14])
end

-- What a repeated key is answered with: the first job as Job reads it.
local job_fields = {'id', 'tenant', 'state', 'key', 'cost', 'deadline', 'enq', 'slot', 'dispatch',
  'delay', 'depth', 'prompt', 'attempts', 'failures', 'sent', 'fin', 'err', 'status', 'request', 'type', 'cbu', 'cbon', 'nb', 'nbo'}
local function repeat_reply(jk)
  local v = redis.call('HMGET', jk, unpack(job_fields))
  if not v[3] then return nil end -- gone (past retention): the key is stale
  local p = redis.call('HMGET', KEYS[1], 'shift', 'until', 'held')
  local r = {2, 0, 0, 0, 0, 0, now, 0, tonumber(p[1]) or 0, tonumber(p[2]) or 0, tonumber(p[3]) or 0}
  for i, f in ipairs(job_fields) do
    if v[i] then r[#r + 1] = f; r[#r + 1] = v[i] end
  end
  return r
end

local out = {}
local longest = 0 -- the latest dispatch time admitted, and its cost
-- Counted over the batch, written once at the end (one command, not one
-- per job); a job kept counts as accepted in the write of its decision.
local admitted, rejected = 0, 0
-- This batch's jobs due by the arrival (its prompt ones): admit_decision
-- counts them whole (OWN_DUE).
local own_due = 0
for j = 0, (#ARGV - a + 1) / 12 - 1 do
  local b = a + j * 12
  local id, payload, key = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local cost, deadline, request = tonumber(ARGV[b + 3]), ARGV[b + 4], ARGV[b + 5]
  local jtype, cb_url, cb_on = ARGV[b + 6], ARGV[b + 7], ARGV[b + 8]
  local not_before, max_scheduled, capped = tonumber(ARGV[b + 9]), tonumber(ARGV[b + 10]), ARGV[b + 11] == '1'
  local jk, ik = KEYS[9 + nw + j * 2], KEYS[10 + nw + j * 2]
  local r
  local first = key ~= '' and redis.call('GET', ik)
  -- (The first job's hash: in the partition's hash tag, the same slot as KEYS.)
  if first then r = repeat_reply(prefix .. 'job:' .. first) end
  if r then
    -- answered as the first time
  elseif mode == 'retry' and redis.call('HGET', jk, 'state') ~= 'failed' then
    r = {4, 0, 0, 0, 0, 0, now, 0, 0, 0, 0, 'state', redis.call('HGET', jk, 'state') or ''}
  else
    local aargv = {now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], cost, -1, '1', deadline, ARGV[6], ARGV[7]}
    for i = 1, 2 * nw do aargv[#aargv + 1] = ARGV[14 + i] end
    local d = admit_decision(akeys, aargv, owner_at, own_due, mode ~= 'retry', not_before, max_scheduled, id, capped)
    -- admit.lua's {admitted, slot, dispatch_at, retry_after, depth, now, prompt, delay, scheduled}
    r = {d[1], d[2], d[3], d[8], d[4], d[5], d[6], d[7], 0, 0, 0}
    if d[1] == 5 then r[12] = 'scheduled'; r[13] = string.format('%d', d[9]) end
  end
  if r[1] == 0 or r[1] == 5 then
    rejected = rejected + 1
  elseif r[1] == 1 or r[1] == 6 then
    local slot, dispatch_at, delay, depth = r[2], r[3], r[4], r[6]
    local state, index = 'queued', KEYS[5]
    if r[1] == 6 then state, index = 'scheduled', prefix .. 'sched:' .. tenant end
    if mode == 'retry' then
      -- It waits again: no longer one of the tenant's failed jobs
      -- (rules.Admit's Resend).
      if (tonumber(redis.call('HGET', KEYS[1], 'failed')) or 0) > 0 then redis.call('HINCRBY', KEYS[1], 'failed', -1) end
      redis.call('HSET', jk, 'state', state, 'slot', slot, 'attempts', 0, 'failures', 0, 'fin', 0)
      redis.call('HDEL', jk, 'nb', 'nbo') -- sent again as an ordinary job: its not_before is spent
      redis.call('PERSIST', jk)
      redis.call('PERSIST', ik)
      redis.call('ZREM', KEYS[4], id)
    else
      redis.call('HSET', jk, 'id', id, 'tenant', tenant, 'state', state, 'payload', payload, 'key', key,
        'cost', cost, 'deadline', deadline, 'enq', now, 'slot', slot,
        'delay', delay, 'depth', depth + 1, 'prompt', r[8], 'attempts', 0, 'failures', 0)
      -- nb: booked for it (takeover.lua books it again); nbo: its place
      -- came after it, and a re-pacing keeps it (repace.lua).
      if r[1] == 6 then
        redis.call('HSET', jk, 'nb', not_before, 'depth', depth)
      elseif not_before > 0 then
        redis.call('HSET', jk, 'nbo', not_before)
      end
      if request ~= '' then redis.call('HSET', jk, 'request', request) end
      if jtype ~= '' then redis.call('HSET', jk, 'type', jtype) end
      if cb_url ~= '' then redis.call('HSET', jk, 'cbu', cb_url, 'cbon', cb_on) end
      -- Kept while the job is, and store.retention after it finishes.
      if key ~= '' then redis.call('SET', ik, id) end
    end
    redis.call('RPUSH', KEYS[2], id .. ' ' .. string.format('%d', dispatch_at) .. ' ' .. tenant)
    redis.call('ZADD', index, slot, id)
    if r[8] == 1 then own_due = own_due + 1 end -- prompt: due by the arrival
    admitted = admitted + 1
    longest = math.max(longest, dispatch_at - now + cost * T)
  end
  out[#out + 1] = r
end

if rejected > 0 then redis.call('HINCRBY', KEYS[1], 'rejected', rejected) end
if admitted > 0 then redis.call('ZINCRBY', KEYS[3], admitted, tenant) end

-- The tenant's state lives while it has jobs; a refusal alone never makes
-- it outlive its idle time. Its windows' bookkeeping, as long as it counts.
-- A job admitted now is waiting (admit_decision wrote depth + 1), so the
-- hash has jobs: settle's answer is PERSIST without reading it again.
if admitted > 0 then
  redis.call('PERSIST', KEYS[1])
else
  settle(KEYS[1], now, idle_ms)
end
if longest > 0 then
  for i = 1, nw do
    keep(KEYS[8 + i], math.floor((longest + tonumber(ARGV[14 + 2 * i])) / 1000) + idle_ms)
  end
end
return out

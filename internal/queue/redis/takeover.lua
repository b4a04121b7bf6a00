-- A new owner's first look at its partition: it takes back the jobs the
-- last owner was sending (it may have sent them: they go again with the
-- same Idempotency-Key), then reads what waits of some of its tenants, to
-- schedule in memory. Fenced (owner.FenceLua is put in front). Run by
-- Store.takeOver (takeover.go). Microseconds.
--
-- KEYS[1]  the partition's lease (the fence)
-- KEYS[2]  the partition's jobs being sent (zset: id -> slot)
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  now (0: the server's TIME)
-- ARGV[3]  the partition's key prefix (partKeys.tag)
-- ARGV[4]  '1': take back the jobs being sent (the first run of a tenure)
-- ARGV[5..] per tenant: its name, its interval and its tolerance
--          ((burst - 1) intervals)
--
-- Returns {now, taken back, {tenant, shift, until, held, next, id, slot,
-- id, slot, ...}, ...}: how many jobs it took back, and per tenant its
-- pause, the earliest its next send may go (the last owner's last claim's
-- dispatch time plus its cost in intervals), and its waiting jobs by slot.
--
-- A tenant whose waiting jobs' slots passed while nobody sent them (the
-- partition had no owner: a worker cut off from Redis, or killed) has them
-- moved, and its tat past them, to where the new owner will really send
-- them: from now (or its next, if later; or, if a job taken back may have
-- been written, its cost after now), one interval a cost apart, with no
-- burst credit (the sends before may have used it), as the embedded store
-- does at a restart (bolt's respaceTenant). So each job says when it goes,
-- and a job admitted after the takeover is promised what it will see, not
-- a slot the backlog has taken.

local now = server_now(ARGV[2])
local prefix = ARGV[3]

local taken = 0
if ARGV[4] == '1' then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local jk = prefix .. 'job:' .. id
    local j = redis.call('HMGET', jk, 'state', 'slot', 'tenant', 'attempts', 'cost')
    if j[1] == 'dispatching' then
      local tk = prefix .. 'tenant:' .. j[3]
      -- It may have been written at any moment up to now: the tenant's
      -- next send comes its cost in intervals after now (respace, below,
      -- in this run or a later one of the same takeover).
      local cost = at_least(tonumber(j[5]) or 1, 1)
      if cost > (tonumber(redis.call('HGET', tk, 'lost')) or 0) then redis.call('HSET', tk, 'lost', cost) end
      -- The claim counted an attempt whose outcome nobody recorded: it
      -- is not counted (the resend is that attempt again, as on the
      -- embedded store, whose claims are not written), and a job with no
      -- attempt recorded waits as queued.
      local attempts = math.max((tonumber(j[4]) or 1) - 1, 0)
      redis.call('HSET', jk, 'state', attempts > 0 and 'retrying' or 'queued', 'attempts', attempts)
      redis.call('ZREM', prefix .. 'claimed:' .. j[3], id)
      redis.call('ZADD', prefix .. 'waiting:' .. j[3], tonumber(j[2]) or 0, id)
      redis.call('HINCRBY', tk, 'inflight', -1)
      redis.call('HINCRBY', tk, 'depth', 1)
      taken = taken + 1
    end
  end
  redis.call('DEL', KEYS[2])
end

-- Moves tk's overdue waiting jobs, and its tat past them (see above):
-- waiting is ZRANGE WITHSCORES, in slot order, and gets their new slots.
local function respace(tk, name, waiting, T, tau, shift, untl, held, nxt, tat)
  if held > 0 or untl > now or #waiting == 0 then return end -- paused: its end moves everything
  local t = at_least(now, nxt)
  local lost = tonumber(redis.call('HGET', tk, 'lost')) or 0
  if lost > 0 then
    t = at_least(t, now + lost * T) -- a write lost in the crash (see above)
    redis.call('HDEL', tk, 'lost')
  end
  t = t - shift -- tenant time
  local moved = false
  for i = 1, #waiting, 2 do
    if tonumber(waiting[i + 1]) >= t then break end -- on schedule: so are the later ones
    -- Written where the new owner will send it, so that what Job says and
    -- what is sent agree.
    local jk = prefix .. 'job:' .. waiting[i]
    local cost = at_least(tonumber(redis.call('HGET', jk, 'cost')) or 1, 1)
    redis.call('ZADD', prefix .. 'waiting:' .. name, t, waiting[i])
    redis.call('HSET', jk, 'slot', t, 'dispatch', t + shift)
    waiting[i + 1] = string.format('%d', t) -- as ZRANGE gives it (tostring would round to 14 digits)
    t, moved = t + cost * T, true
  end
  if moved and t + tau > tat then redis.call('HSET', tk, 'tat', t + tau) end
end

local out = {now, taken}
for i = 5, #ARGV, 3 do
  local name, T, tau = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local tk = prefix .. 'tenant:' .. name
  local h = redis.call('HMGET', tk, 'shift', 'until', 'held', 'next', 'tat')
  local shift, untl, held, nxt = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
  local r = {name, shift, untl, held, nxt}
  local waiting = redis.call('ZRANGE', prefix .. 'waiting:' .. name, 0, -1, 'WITHSCORES')
  respace(tk, name, waiting, T, tau, shift, untl, held, nxt, tonumber(h[5]) or 0)
  for _, v in ipairs(waiting) do r[#r + 1] = v end
  out[#out + 1] = r
end
return out

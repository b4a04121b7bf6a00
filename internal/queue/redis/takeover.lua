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
-- ARGV[5..] tenant names
--
-- Returns {now, taken back, {tenant, shift, until, held, next, id, slot,
-- id, slot, ...}, ...}: how many jobs it took back, and per tenant its
-- pause, the earliest its next send may go (the last owner's last claim's
-- dispatch time plus its cost in intervals), and its waiting jobs by slot.

local now = server_now(ARGV[2])
local prefix = ARGV[3]

local taken = 0
if ARGV[4] == '1' then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local jk = prefix .. 'job:' .. id
    local j = redis.call('HMGET', jk, 'state', 'slot', 'tenant')
    if j[1] == 'dispatching' then
      local tk = prefix .. 'tenant:' .. j[3]
      redis.call('HSET', jk, 'state', 'retrying')
      redis.call('ZREM', prefix .. 'claimed:' .. j[3], id)
      redis.call('ZADD', prefix .. 'waiting:' .. j[3], tonumber(j[2]) or 0, id)
      redis.call('HINCRBY', tk, 'inflight', -1)
      redis.call('HINCRBY', tk, 'depth', 1)
      taken = taken + 1
    end
  end
  redis.call('DEL', KEYS[2])
end

local out = {now, taken}
for i = 5, #ARGV do
  local name = ARGV[i]
  local h = redis.call('HMGET', prefix .. 'tenant:' .. name, 'shift', 'until', 'held', 'next')
  local r = {name, tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0}
  for _, v in ipairs(redis.call('ZRANGE', prefix .. 'waiting:' .. name, 0, -1, 'WITHSCORES')) do r[#r + 1] = v end
  out[#out + 1] = r
end
return out

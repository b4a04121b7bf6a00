-- A tenant's pause, atomically: the same rules as leaky.Pause (PauseUntil,
-- Hold, Resume) and the embedded store's TAT floor after a pause (no burst
-- when it ends), checked against them in admit_lua_test.go. Run by
-- Store.Pause and Store.Resume (hold.go) with 'hold' and 'resume'; a
-- pushback ('until') is recorded by the Go rule instead (outcome.go), and
-- 'until' is here so the tests check the whole of leaky.Pause. Microseconds.
--
-- KEYS[1]  the tenant's hash: tat, shift, until, held
-- ARGV[1]  op: 'until' | 'hold' | 'resume'
-- ARGV[2]  now (0: the server's TIME)
-- ARGV[3]  tolerance: (burst-1) * interval
-- ARGV[4]  'until': the end of the pause
-- ARGV[5]  'until': the slot of the job pushed back (0: none)
--
-- Returns {shift, until, held, tat}.

local function at_least(a, b) if a > b then return a end return b end

local op = ARGV[1]
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tau = tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'tat', 'shift', 'until', 'held')
local tat = tonumber(h[1]) or 0
local shift, untl, held = tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0

local function tenant_time(t)
  if held > 0 and held < t then t = held end
  if t < untl then t = untl end
  return t - shift
end

if op == 'until' then
  local stop, from = tonumber(ARGV[4]), tonumber(ARGV[5])
  if stop > now then
    local frozen = tenant_time(now)
    if from ~= 0 and from < frozen then frozen = from end
    untl = at_least(untl, stop)
    shift = untl - frozen
    tat = at_least(tat, tenant_time(now) + tau)
  end
elseif op == 'hold' then
  if held == 0 then held = now end
  tat = at_least(tat, tenant_time(now) + tau)
elseif op == 'resume' then
  if held ~= 0 then
    local frozen = tenant_time(now)
    held = 0
    untl = at_least(untl, now)
    shift = untl - frozen
  end
else
  return redis.error_reply('unknown op ' .. tostring(op))
end
redis.call('HSET', KEYS[1], 'tat', tat, 'shift', shift, 'until', untl, 'held', held)
return {shift, untl, held, tat}

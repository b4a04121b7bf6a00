-- The gate of a downstream ceiling, shared by the owners of every
-- partition: one atomic check right before a request is written. A GCRA
-- per lane (the tenant's rate; the downstream's ceiling) and the lanes'
-- windows ("N per DURATION", counted on the grants, that is on real
-- sends), in the server's time. A grant holds the downstream's lane until
-- its sender confirms when it wrote (gateconfirm.lua), for a second at
-- most: a write that came late moves the lane on before the next grant.
-- Run by Store.PassGate (gate.go). Microseconds.
--
-- KEYS[1]    the tenant's lane (a hash: tat, hold)
-- KEYS[2]    the downstream's lane (a hash: tat, hold, pend: the time of
--            the grant not yet confirmed)
-- KEYS[3..]  one list per window, the tenant's then the downstream's: the
--            times of their last N grants
-- ARGV[1]    now (0: the server's TIME)
-- ARGV[2]    the tenant's interval
-- ARGV[3]    the tenant's tolerance
-- ARGV[4]    the downstream's interval (0: no ceiling, holds only)
-- ARGV[5]    the downstream's tolerance
-- ARGV[6]    cost
-- ARGV[7]    idle ttl (ms)
-- ARGV[8]    the number of the tenant's windows
-- ARGV[9]    the number of the downstream's windows
-- ARGV[10..] n and length per window
-- then       to give back a grant that was not used and ask again:
--            'again', then the grant's tat_t_before, tat_t_after,
--            tat_d_before, tat_d_after, granted_at (the reply's items 4-8)
--
-- Returns {code, wait, held_until, tat_t_before, tat_t_after, tat_d_before,
-- tat_d_after, granted_at}: code 0 go (a grant: each lane's TAT before and
-- after it, and its time), 1 not yet (wait), 2 a lane is held (pushback,
-- operator hold) until held_until. Giving a grant back puts each lane's
-- TAT back and takes it out of the windows, unless a grant came after it,
-- and ends its hold on the lane.

local function at_least(a, b) if a > b then return a end return b end
local function at_most(a, b) if a < b then return a end return b end
-- How long an unconfirmed grant holds the downstream's lane at most (its
-- sender may have died), and how soon a send held by one asks again.
local pend_max, pend_poll = 1000000, 1000

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local Tt, taut, Td, taud = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, idle_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local nw = tonumber(ARGV[8]) + tonumber(ARGV[9])
local windows = {}
for i = 1, nw do
  windows[i] = {key = KEYS[2 + i], n = tonumber(ARGV[8 + 2 * i]), len = tonumber(ARGV[9 + 2 * i])}
end
local a = 10 + 2 * nw -- where 'again' would be

if ARGV[a] == 'again' then
  local undone = true
  for i = 1, 2 do
    local before, after = tonumber(ARGV[a - 1 + 2 * i]), tonumber(ARGV[a + 2 * i])
    if before ~= after then
      if tonumber(redis.call('HGET', KEYS[i], 'tat') or 0) == after then
        redis.call('HSET', KEYS[i], 'tat', before)
      else
        undone = false
      end
    end
  end
  if undone then
    for _, w in ipairs(windows) do redis.call('LREM', w.key, -cost, ARGV[a + 5]) end
  end
  if redis.call('HGET', KEYS[2], 'pend') == ARGV[a + 5] then redis.call('HDEL', KEYS[2], 'pend') end
end

local t = redis.call('HMGET', KEYS[1], 'tat', 'hold')
local d = redis.call('HMGET', KEYS[2], 'tat', 'hold', 'pend')
local tat_t, hold_t = tonumber(t[1]) or 0, tonumber(t[2]) or 0
local tat_d, hold_d, pend = tonumber(d[1]) or 0, tonumber(d[2]) or 0, tonumber(d[3]) or 0

local hold = at_least(hold_t, hold_d)
if hold > now then return {2, 0, hold, 0, 0, 0, 0, 0} end
-- No send goes before its time: DESIGN.md's 2 ms of jitter belong to the
-- machine.
local wait = tat_t - taut - now
if Td > 0 then wait = at_least(wait, tat_d - taud - now) end
if Td > 0 and pend > 0 and now < pend + pend_max then
  wait = at_least(wait, at_most(pend_poll, pend + pend_max - now))
end
for _, w in ipairs(windows) do
  -- Room for cost more sends: the one cost places from the end must have
  -- left the window.
  local size = redis.call('LLEN', w.key)
  local out = size + cost - w.n
  if out > 0 then
    wait = at_least(wait, tonumber(redis.call('LINDEX', w.key, out - 1)) + w.len - now)
  end
end
if wait > 0 then return {1, wait, 0, 0, 0, 0, 0, 0} end

local out = {0, 0, 0, tat_t, 0, tat_d, tat_d, now}
tat_t = at_least(tat_t, now) + cost * Tt
redis.call('HSET', KEYS[1], 'tat', tat_t)
redis.call('PEXPIRE', KEYS[1], math.floor((tat_t - now) / 1000) + idle_ms)
out[5] = tat_t
if Td > 0 then
  tat_d = at_least(tat_d, now) + cost * Td
  redis.call('HSET', KEYS[2], 'tat', tat_d, 'pend', now)
  redis.call('PEXPIRE', KEYS[2], math.floor((tat_d - now) / 1000) + idle_ms)
  out[7] = tat_d
end
for _, w in ipairs(windows) do
  for _ = 1, cost do redis.call('RPUSH', w.key, now) end
  redis.call('LTRIM', w.key, -w.n, -1)
  redis.call('PEXPIRE', w.key, math.floor(w.len / 1000) + idle_ms)
end
return out

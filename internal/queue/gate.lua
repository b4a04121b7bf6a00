-- The dispatch gate shared by every process: one atomic check right before
-- a request is written, so the spacing the downstream sees holds whatever
-- asynq's polling, early starts, retries and many workers do. A GCRA per
-- lane (the tenant's rate; the downstream's ceiling), in the server's time.
-- Microseconds.
--
-- KEYS  1 the tenant's lane, 2 the downstream's lane (hashes: tat, hold)
-- ARGV  1 now (0: the server's TIME), 2 tenant interval, 3 tenant
--       tolerance, 4 downstream interval (0: no ceiling, holds only),
--       5 downstream tolerance, 6 cost, 7 slack (how early a send may go:
--       late timers must not push the rest back), 8 idle ttl (ms);
--       to give back a grant that was not used and ask again: 9 'again',
--       then the grant's four TATs (see below)
--
-- Returns {0, tat before, tat after (tenant), tat before, tat after
-- (downstream)} go; {1, wait} not yet; {2, until} a lane is held
-- (pushback, operator hold) until then. Giving a grant back puts each
-- lane's TAT back, if no grant came after it.

local function at_least(a, b) if a > b then return a end return b end

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local Tt, taut, Td, taud = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, slack, idle_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

if ARGV[9] == 'again' then
  for i = 1, 2 do
    local before, after = tonumber(ARGV[8 + 2 * i]), tonumber(ARGV[9 + 2 * i])
    if before ~= after and tonumber(redis.call('HGET', KEYS[i], 'tat') or 0) == after then
      redis.call('HSET', KEYS[i], 'tat', before)
    end
  end
end

local t = redis.call('HMGET', KEYS[1], 'tat', 'hold')
local d = redis.call('HMGET', KEYS[2], 'tat', 'hold')
local tat_t, hold_t = tonumber(t[1]) or 0, tonumber(t[2]) or 0
local tat_d, hold_d = tonumber(d[1]) or 0, tonumber(d[2]) or 0

local hold = at_least(hold_t, hold_d)
if hold > now then return {2, hold} end
local wait = tat_t - taut - slack - now
if Td > 0 then wait = at_least(wait, tat_d - taud - slack - now) end
if wait > 0 then return {1, wait} end

local out = {0, tat_t, 0, tat_d, tat_d}
tat_t = at_least(tat_t, now) + cost * Tt
redis.call('HSET', KEYS[1], 'tat', tat_t)
redis.call('PEXPIRE', KEYS[1], math.floor((tat_t - now) / 1000) + idle_ms)
out[3] = tat_t
if Td > 0 then
  tat_d = at_least(tat_d, now) + cost * Td
  redis.call('HSET', KEYS[2], 'tat', tat_d)
  redis.call('PEXPIRE', KEYS[2], math.floor((tat_d - now) / 1000) + idle_ms)
  out[5] = tat_d
end
return out

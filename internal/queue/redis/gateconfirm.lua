-- Confirms a grant of gate.lua: its request was written late after the
-- grant was asked for (on the sender's clock; the grant's own time is an
-- upper bound of the asking, so granted_at + late is no earlier than the
-- write), or not at all. Each lane's TAT moves on to at least the write
-- plus its cost, and the downstream's lane is free for the next grant.
-- Run by the Confirm of Store.PassGate's answer (gate.go). Microseconds.
--
-- KEYS[1]  the tenant's lane
-- KEYS[2]  the downstream's lane
-- ARGV[1]  the grant's time (gate.lua's granted_at)
-- ARGV[2]  late: from asking to the write, on the sender's clock
-- ARGV[3]  written: '1', or '0' (the grant was not used: nothing moves)
-- ARGV[4]  the tenant's interval
-- ARGV[5]  the downstream's interval
-- ARGV[6]  cost
--
-- Returns 1.

local granted, late = tonumber(ARGV[1]), tonumber(ARGV[2])
local Tt, Td, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('HGET', KEYS[2], 'pend') == ARGV[1] then redis.call('HDEL', KEYS[2], 'pend') end
if ARGV[3] ~= '1' then return 1 end
local wrote = granted + late
for i, T in ipairs({Tt, Td}) do
  local tat = tonumber(redis.call('HGET', KEYS[i], 'tat') or 0)
  if T > 0 and tat > 0 and tat < wrote + cost * T then
    redis.call('HSET', KEYS[i], 'tat', wrote + cost * T)
  end
end
return 1

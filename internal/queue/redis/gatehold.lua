-- Holds or frees a gate lane (see gate.lua), so that sends already handed
-- to any process's dispatcher stop: after a pushback (Store.holdLanes,
-- gate.go) and for an operator's hold (Store.setHold, hold.go).
-- Microseconds.
--
-- KEYS[1]  the lane
-- ARGV[1]  op: 'until' (a pushback: held until ARGV[2]; the first send
--          after it goes at once and the rest one interval apart),
--          'hold' (an operator's, until freed), 'free'
-- ARGV[2]  'until': the end of the hold
-- ARGV[3]  'until': the lane's tolerance
-- ARGV[4]  how long the lane outlives the hold (ms)
--
-- Returns 1.

local op = ARGV[1]
if op == 'free' then
  redis.call('HDEL', KEYS[1], 'hold')
  return 1
end
local h = redis.call('HMGET', KEYS[1], 'hold', 'tat')
local hold, tat = tonumber(h[1]) or 0, tonumber(h[2]) or 0
local ms = tonumber(ARGV[4])
if op == 'hold' then
  hold = 9007199254740991 -- 2^53 - 1: until freed
else
  local stop = tonumber(ARGV[2])
  if stop > hold then hold = stop end
  if stop + tonumber(ARGV[3]) > tat then tat = stop + tonumber(ARGV[3]) end
  local t = redis.call('TIME')
  ms = ms + math.floor((hold - (tonumber(t[1]) * 1000000 + tonumber(t[2]))) / 1000)
end
redis.call('HSET', KEYS[1], 'hold', hold, 'tat', tat)
if ms > 0 then redis.call('PEXPIRE', KEYS[1], ms) end
return 1

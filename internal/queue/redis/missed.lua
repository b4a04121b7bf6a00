-- The waiting jobs of a tenant that its pause moved past their deadlines
-- (lib.lua's missed_deadline), read right after a pushback paused it: its
-- owner looks at each at its deadline, when the claim expires it. Without
-- this the owner looked at such a job only when the tenant's pace let it
-- go, and resends of a job answered 429 again and again took every turn:
-- it stayed queued, and counted, past its deadline. Read only. Run by
-- Store.missedDeadlines (outcome.go). Microseconds.
--
-- KEYS[1]  the tenant's hash: shift, until, held
-- KEYS[2]  the tenant's waiting jobs (zset: id -> slot)
-- ARGV[1]  the partition's key prefix (partKeys.tag)
--
-- Returns {id, deadline, id, deadline, ...}.

local h = redis.call('HMGET', KEYS[1], 'shift', 'until', 'held')
local shift, untl, held = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
local out = {}
if held > 0 then return out end -- its claims look at its deadlines (claim.lua)
local waiting = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for w = 1, #waiting, 2 do
  local missed = missed_deadline(ARGV[1], waiting[w], tonumber(waiting[w + 1]), shift, untl, held)
  if missed > 0 then
    out[#out + 1] = waiting[w]
    out[#out + 1] = missed
  end
end
return out

-- Places for attempts in flight under caps (DESIGN.md 6e), shared by
-- every process: one sorted set per scope (a downstream; each of its
-- tenants), of the places taken (member: a job id; score: when the place
-- lapses, should its holder die without giving it back). An owner takes
-- a job's places before it claims the job and gives them back once its
-- outcome is recorded (Store.unplace); while it holds them it moves their
-- ends on (Store.keepPlaces). Run by Store.takePlaces (places.go).
-- Microseconds.
--
-- KEYS[1]    the downstream's places
-- KEYS[2..]  the places of each tenant asked for
-- ARGV[1]    now
-- ARGV[2]    when a place taken now lapses
-- ARGV[3]    the downstream's cap (0: none)
-- ARGV[4]    '1': take them whatever the counts (jobs already being sent
--            when a reload capped them: they are open, counted or not)
-- ARGV[5..]  per job, in the order its places are asked for: the index
--            in KEYS of its tenant's places, its tenant's cap (0: none),
--            and its place's name (its id and its owner's tenure: a
--            place a dead owner left for the same job still counts)
--
-- Returns one 1 (its places taken) or 0 (a cap is reached) per job. A
-- tenant refused once is refused for the rest of the call: its jobs go in
-- order.

local now, lapse, dcap, force = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local counts = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  counts[i] = redis.call('ZCARD', KEYS[i])
end
local out, refused = {}, {}
for a = 5, #ARGV, 3 do
  local ti, tcap, id = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
  local ok = force or (not refused[ti] and (dcap == 0 or counts[1] < dcap) and (tcap == 0 or counts[ti] < tcap))
  if ok then
    if dcap > 0 then
      redis.call('ZADD', KEYS[1], lapse, id)
      counts[1] = counts[1] + 1
    end
    if tcap > 0 then
      redis.call('ZADD', KEYS[ti], lapse, id)
      counts[ti] = counts[ti] + 1
    end
    out[#out + 1] = 1
  else
    refused[ti] = true
    out[#out + 1] = 0
  end
end
local ttl = math.floor((lapse - now) / 1000) + 1
for i = 1, #KEYS do
  if counts[i] > 0 then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return out

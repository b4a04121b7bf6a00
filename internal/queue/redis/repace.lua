-- Places a tenant's waiting jobs anew by its new policy (set by the API),
-- as rules.Repace does (TestLuaRepaceAgreesWithRules holds the two
-- together): in their order, each as the schedule's next place from the
-- later of now, the jobs handed over and the next send by the last claim,
-- within the windows, with no burst credit. Their old places leave each
-- window's list that is not full first. A booked retry and a job booked
-- for its not_before keep their slots and the others go around them
-- (Record.Absorb, as admit.lua); a job whose not_before ('nbo': admitted
-- into the queue) its new place would come before is booked there
-- instead. Where the windows' sends made are known (their sent lists),
-- each window's list is first made of them, the jobs handed over and the
-- bookings, as rules.Repace does. A paused or held tenant is left as it is. Fenced
-- (owner.FenceLua is put in front).
-- Run by owned.repace (repace.go). Microseconds.
--
-- KEYS[1]  the partition's lease (the fence)
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  now (0: the server's TIME)
-- ARGV[3]  the partition's key prefix (partKeys.tag)
-- ARGV[4]  the tenant
-- ARGV[5]  its interval
-- ARGV[6]  its tolerance ((burst - 1) intervals)
-- ARGV[7]  its capacity
-- ARGV[8]  the end of the jobs handed over (their last slot plus its cost
--          in intervals, tenant time; 0: none)
-- ARGV[9]  idle ttl (ms)
-- ARGV[10] its number of windows, then per window its key's suffix
--          (leaky.Window.String), N and length; then the number of its
--          jobs handed over and not recorded, then each one's slot and
--          cost
--
-- Returns {now, id, slot, dispatch, ...}: the jobs moved, each with its
-- new slot (tenant time) and dispatch time.

local now = server_now(ARGV[2])
local prefix, name = ARGV[3], ARGV[4]
local T, tau, capacity = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local handed_end, idle_ms = tonumber(ARGV[8]), tonumber(ARGV[9])
local windows = {}
for w = 1, tonumber(ARGV[10]) do
  local at = 11 + (w - 1) * 3
  windows[w] = {key = prefix .. 'window:' .. name .. ':' .. ARGV[at], sent = prefix .. 'sent:' .. name .. ':' .. ARGV[at],
                n = tonumber(ARGV[at + 1]), len = tonumber(ARGV[at + 2])}
end
local handed = {}
local hat = 11 + #windows * 3
for k = 1, tonumber(ARGV[hat]) do
  handed[k] = {slot = tonumber(ARGV[hat + 2 * k - 1]), cost = tonumber(ARGV[hat + 2 * k])}
end

local out = {now}
local tk = prefix .. 'tenant:' .. name
local h = redis.call('HMGET', tk, 'shift', 'until', 'held', 'last', 'lastcost', 'booked')
local shift, untl, held = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
if held > 0 or untl > now then return out end
local waiting = redis.call('ZRANGE', prefix .. 'waiting:' .. name, 0, -1, 'WITHSCORES')
if #waiting == 0 then return out end

local floor = now
if handed_end > 0 then floor = at_least(floor, handed_end + shift) end
local last = tonumber(h[4]) or 0
if last > 0 then floor = at_least(floor, last + T * at_least(tonumber(h[5]) or 1, 1)) end
floor = floor - shift -- tenant time

local booked = booked_parse(h[6])
local is_booked = {}
for _, b in ipairs(booked) do is_booked[b.id] = true end
-- Jobs booked for their not_before keep their slots; one the queue had
-- reached (absorbed) is booked again, as the queue is placed anew.
local rebooked = false
local sched = redis.call('ZRANGE', prefix .. 'sched:' .. name, 0, -1, 'WITHSCORES')
for i = 1, #sched, 2 do
  local id, slot = sched[i], tonumber(sched[i + 1])
  if not is_booked[id] then
    local cost = at_least(tonumber(redis.call('HGET', prefix .. 'job:' .. id, 'cost')) or 1, 1)
    local at = #booked + 1
    while at > 1 and booked[at - 1].slot > slot do at = at - 1 end
    table.insert(booked, at, {slot = slot, cost = cost, id = id})
    is_booked[id], rebooked = true, true
  end
end
local costs, not_before = {}, {}
for i = 1, #waiting, 2 do
  local j = redis.call('HMGET', prefix .. 'job:' .. waiting[i], 'cost', 'nbo')
  costs[i] = at_least(tonumber(j[1]) or 1, 1)
  not_before[i] = (tonumber(j[2]) or 0) > 0 and tonumber(j[2]) - shift or nil -- tenant time
end

-- The windows count the sends made, the jobs handed over and the
-- bookings; not knowing the sends made, the old places leave the windows
-- that are not full: they were not sent.
local made = #windows > 0 and made_lists(windows)
for w, win in ipairs(windows) do
  if made then
    local l = made[w]
    for _, j in ipairs(handed) do list_record(l, win.n, j.slot, j.cost) end
    for _, b in ipairs(booked) do list_record(l, win.n, b.slot, b.cost) end
    redis.call('DEL', win.key)
    if #l > 0 then redis.call('RPUSH', win.key, unpack(l)) end
  elseif redis.call('LLEN', win.key) < win.n then
    for i = 1, #waiting, 2 do
      if not is_booked[waiting[i]] then redis.call('LREM', win.key, costs[i], waiting[i + 1]) end
    end
  end
end

local tat = floor + tau -- the next place is at floor, with no burst credit
local absorbed = 0
local moved_any = false
for i = 1, #waiting, 2 do
  local id, cost = waiting[i], costs[i]
  if not is_booked[id] then
    tat, absorbed = absorb(booked, absorbed, floor, tat, tau, T, cost, windows, #windows > 0 and capacity > 0)
    -- Record.Reserve: the next place, within the windows; one before
    -- the job's not_before books it there instead, and the rest go
    -- around it.
    local place = at_least(floor, tat - tau)
    tat = at_least(tat, floor) + cost * T
    local nb = not_before[i]
    local slot = place
    if nb and nb > slot then slot = nb end
    if #windows > 0 then slot = windows_slot(windows, slot, cost) end
    if nb and nb > place then
      slot = clear_of_bookings(booked, absorbed + 1, slot, cost, T, windows)
      local at = #booked + 1
      while at > absorbed + 1 and booked[at - 1].slot > slot do at = at - 1 end
      table.insert(booked, at, {slot = slot, cost = cost, id = id})
      rebooked = true
    end
    if #windows > 0 then
      windows_record(windows, slot, cost)
      if not (nb and nb > place) and slot + cost * T > tat then tat = slot + cost * T end
    end
    if slot ~= tonumber(waiting[i + 1]) then
      redis.call('ZADD', prefix .. 'waiting:' .. name, slot, id)
      redis.call('HSET', prefix .. 'job:' .. id, 'slot', slot, 'dispatch', slot + shift)
      out[#out + 1] = id
      out[#out + 1] = slot
      out[#out + 1] = slot + shift
      moved_any = true
    end
  end
end
if absorbed > 0 or rebooked then booked_write(tk, booked, absorbed + 1) end
redis.call('HSET', tk, 'tat', tat)
redis.call('HDEL', tk, 'behind')
-- The windows' lists live as long as they count the jobs placed, plus the
-- idle time, as admission keeps them.
if moved_any or made then
  for _, w in ipairs(windows) do keep(w.key, math.floor((tat + shift - now + w.len) / 1000) + idle_ms) end
end
return out

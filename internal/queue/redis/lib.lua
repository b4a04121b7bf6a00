-- Helpers shared by the Redis scripts, put in front of each script that
-- uses them (newScript in script.go, withLib). Microseconds. Each is a
-- local function of the script it is put in front of: a script that uses
-- none of them loads without it.

local function at_least(a, b) if a > b then return a end return b end

-- The time a script decides at: ARGV's (a test clock), or the server's
-- TIME (0: one clock for every process).
local function server_now(arg)
  local now = tonumber(arg)
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- A tenant's hash lives while it has jobs (waiting, scheduled or being sent) or an
-- operator's hold; once it has neither, it expires idle_ms after its
-- schedule runs out. Called wherever those counts change.
-- settle_known is settle for a caller that has the hash's fields at hand.
local function settle_known(tk, now, idle_ms, jobs, held, tat, shift, untl)
  if jobs > 0 or held > 0 then
    redis.call('PERSIST', tk)
    return
  end
  local real_tat = at_least(untl, tat + shift)
  redis.call('PEXPIRE', tk, at_least(0, math.floor((real_tat - now) / 1000)) + idle_ms)
end
local function settle(tk, now, idle_ms)
  local h = redis.call('HMGET', tk, 'depth', 'inflight', 'held', 'tat', 'shift', 'until', 'scheduled')
  settle_known(tk, now, idle_ms, (tonumber(h[1]) or 0) + (tonumber(h[2]) or 0) + (tonumber(h[7]) or 0), tonumber(h[3]) or 0,
    tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0)
end

-- Keeps key k at least ms more.
local function keep(k, ms)
  local cur = redis.call('PTTL', k)
  if cur == -1 or (cur >= 0 and cur < ms) then redis.call('PEXPIRE', k, ms) end
end

-- The tenant time at now of the tenant of hash tk (leaky.Pause.TenantTime).
local function tenant_time(tk, now)
  local h = redis.call('HMGET', tk, 'shift', 'until', 'held')
  local shift, untl, held = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  local t = now
  if held > 0 and held < t then t = held end
  if t < untl then t = untl end
  return t - shift
end

-- The deadline of waiting job id (its hash under prefix) of slot, if its
-- tenant's pause (shift, until) moves its dispatch time past it, or if
-- its tenant is held (it goes at the resume, which may come after it);
-- else 0. The owner then looks at it at its deadline, when its claim
-- expires it (held: a resume before that wakes it as any held job), not
-- when its tenant's pace would let it go (takeover.lua, missed.lua).
local function missed_deadline(prefix, id, slot, shift, untl, held)
  local deadline = tonumber(redis.call('HGET', prefix .. 'job:' .. id, 'deadline')) or 0
  if deadline > 0 and (held > 0 or at_least(untl, slot + shift) > deadline) then return deadline end
  return 0
end

-- A claimed job of slot ended at tenant time tnow: it leaves the tenant's
-- claimed set (see partKeys.claimed) once its slot has come. Until then
-- it keeps its place, as any job short of its slot (an attempt that ended
-- early does not free a place early), and the set lives at least until
-- then. Places whose slots have come go with it.
local function leave_claimed(claimed, slot, tnow, idle_ms)
  redis.call('ZREMRANGEBYSCORE', claimed, '-inf', tnow)
  if slot > tnow then keep(claimed, math.floor((slot - tnow) / 1000) + idle_ms) end
end

-- A job's idempotency key (see partKeys.idem).
local function idem_key(prefix, tenant, key)
  return prefix .. 'key:' .. #tenant .. ':' .. tenant .. ':' .. key
end

-- Tells every process that jobs ids (a list) reached a final state, in
-- the write that puts them there (GET /v1/jobs/{id}?wait): the channel is
-- finished.go's finishedChannel.
local function tell_finished(ids)
  if #ids > 0 then redis.call('PUBLISH', 'throttler:finished', table.concat(ids, ' ')) end
end

-- Owes the callbacks of jobs ids (a list) that just reached a final
-- state (each hash's 'state' written), in the write that puts them there,
-- so a crash between the two cannot lose one (DESIGN.md 6b): pending, due
-- now, in the partition's callbacks zset (id -> when next due; callbacks.go).
-- known, if given, holds what the caller read already of a job: id ->
-- {cbu, cbon, state}, which spares a read per job.
local function owe_callbacks(prefix, ids, now, known)
  for _, id in ipairs(ids) do
    local jk = prefix .. 'job:' .. id
    local c = known and known[id] or redis.call('HMGET', jk, 'cbu', 'cbon', 'state')
    if c[1] and c[1] ~= '' and (not c[2] or c[2] == '' or string.find(',' .. c[2] .. ',', ',' .. c[3] .. ',', 1, true)) then
      redis.call('HSET', jk, 'cbs', 'pending', 'cba', 0, 'cbe', '', 'cbn', now)
      redis.call('ZADD', prefix .. 'callbacks', now, id)
    end
  end
end

-- One fewer job of tenant in the partition's active set.
local function inactive(active, tenant)
  if tonumber(redis.call('ZINCRBY', active, -1, tenant)) <= 0 then redis.call('ZREM', active, tenant) end
end

-- The tenants of a batch script, each one's hash read once, on first
-- sight: tenant_of(name) is its table (key, name, and each of fields, a
-- list of {hash field, table key} pairs, as a number, 0 if unset; then
-- fresh(t) sets up the batch's own counts); list holds them in the order
-- first seen.
local function tenant_batch(prefix, fields, fresh)
  local by, list = {}, {}
  local hash_fields = {}
  for i, f in ipairs(fields) do hash_fields[i] = f[1] end
  local function tenant_of(name)
    local t = by[name]
    if t then return t end
    local tk = prefix .. 'tenant:' .. name
    local h = redis.call('HMGET', tk, unpack(hash_fields))
    t = {key = tk, name = name}
    for i, f in ipairs(fields) do t[f[2]] = tonumber(h[i]) or 0 end
    fresh(t)
    by[name] = t
    list[#list + 1] = t
    return t
  end
  return tenant_of, list
end

-- The first time at or after at when a job of cost fits in every window
-- of windows ({key, n, len}: each key a list of the slots of its last n
-- sends, oldest first; leaky.WindowSlot).
local function windows_slot(windows, at, cost)
  for _, w in ipairs(windows) do
    local size = redis.call('LLEN', w.key)
    local out = math.min(size + cost - w.n, size) -- cost > n never fits: refused before
    if out > 0 then
      at = at_least(at, tonumber(redis.call('LINDEX', w.key, out - 1)) + w.len)
    end
  end
  return at
end

-- Counts a send at slot of cost in every window of windows, in slot order.
local function windows_record(windows, slot, cost)
  for _, w in ipairs(windows) do
    local last = tonumber(redis.call('LINDEX', w.key, -1))
    if last == nil or last <= slot then
      for _ = 1, cost do redis.call('RPUSH', w.key, slot) end
    else -- out of order (rare): before the first later one, found from the end
      local pivot = last
      local i = -2
      while true do
        local v = tonumber(redis.call('LINDEX', w.key, i))
        if v == nil or v <= slot then break end
        pivot, i = v, i - 1
      end
      for _ = 1, cost do redis.call('LINSERT', w.key, 'BEFORE', pivot, slot) end
    end
    redis.call('LTRIM', w.key, -w.n, -1)
  end
end

-- rules.Record.Absorb: a job of cost placed at arrival (tenant time) goes
-- around the retries booked ahead (booked, soonest first: booked_parse);
-- each booking from absorbed + 1 on that it would pass or crowd joins the
-- schedule first. Returns the schedule's tat and how many bookings it
-- absorbed in all. counted: the tenant's admission counts its waiting
-- jobs by slot (rules.CountsWaiting: windows and a capacity).
local function absorb(booked, absorbed, arrival, tat, tau, T, cost, windows, counted)
  while absorbed < #booked do
    local b = booked[absorbed + 1]
    local s = at_least(arrival, tat - tau)
    local after = at_least(tat, arrival) + cost * T
    if counted then
      s = windows_slot(windows, s, cost)
      after = at_least(after, s + cost * T)
    end
    if s < b.slot and b.slot >= after - tau then break end
    tat = at_least(tat, b.slot) + b.cost * T
    absorbed = absorbed + 1
  end
  return tat, absorbed
end

-- rules.Record.clearOfBookings: the first time at or after at when a send
-- of cost is a whole cost apart from each booking of booked from the
-- from-th on, in every window of windows.
local function clear_of_bookings(booked, from, at, cost, T, windows)
  for _ = from, #booked + 1 do
    local moved = false
    for i = from, #booked do
      local b = booked[i]
      if at < b.slot + b.cost * T and b.slot < at + cost * T then at, moved = b.slot + b.cost * T, true end
    end
    if #windows > 0 then
      local ws = windows_slot(windows, at, cost)
      if ws > at then moved = true end
      at = ws
    end
    if not moved then break end
  end
  return at
end

-- Moves a send of cost counted at slot in every window of windows to at,
-- if later: the windows count it where it may really have been written
-- (leaky.Written).
local function windows_written(windows, slot, at, cost)
  if at <= slot then return end
  for _, w in ipairs(windows) do
    local removed = redis.call('LREM', w.key, -cost, slot)
    if removed > 0 then windows_record({w}, at, removed) end
  end
end

-- leaky.EarliestAmong: the first time at or after at when a send of cost
-- fits in a window of n per len among sends (numbers, sorted, on either
-- side of at), each send counted only in the windows that hold it.
local function earliest_among(sends, n, len, at, cost)
  if cost > n then -- never fits; refused before
    if #sends == 0 then return at end
    return at_least(at, sends[#sends] + len)
  end
  local function upto(t) -- how many sends are at or before t
    local lo, hi = 1, #sends + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if sends[mid] > t then hi = mid else lo = mid + 1 end
    end
    return lo - 1
  end
  local function fits(t)
    if upto(t) - upto(t - len) + cost > n then return false end
    local k = upto(t) + 1
    while k <= #sends and sends[k] < t + len do
      if upto(sends[k]) - upto(sends[k] - len) + cost > n then return false end
      k = k + 1
    end
    return true
  end
  local k, t = upto(at - len) + 1, at
  while true do
    if fits(t) then return t end
    while k <= #sends and sends[k] + len <= t do k = k + 1 end
    if k > #sends then return t end -- not reached: past every send, cost <= n fits
    t = sends[k] + len
    k = k + 1
  end
end

-- Adds cost sends at at to list (numbers, sorted) and keeps its newest n
-- (leaky.Recent.Add).
local function list_record(list, n, at, cost)
  for _ = 1, cost do
    local i = #list + 1
    while i > 1 and list[i - 1] > at do i = i - 1 end
    table.insert(list, i, at)
  end
  while #list > n do table.remove(list, 1) end
end

-- rules.placeAround: the first time at or after at when a send of cost is
-- a whole cost apart from every booking of ahead ({slot, cost}) and fits
-- in every window of windows ({n, len}), counting the sends of lists
-- (lists[i] for windows[i], before at) and the bookings.
local function place_around(lists, windows, ahead, at, cost, T)
  local sends = {}
  for w, l in ipairs(lists) do
    local s = {}
    for i, v in ipairs(l) do s[i] = v end
    for _, b in ipairs(ahead) do
      for _ = 1, b.cost do s[#s + 1] = b.slot end
    end
    table.sort(s)
    sends[w] = s
  end
  while true do
    local moved = false
    for _, b in ipairs(ahead) do
      if at < b.slot + b.cost * T and b.slot < at + cost * T then at, moved = b.slot + b.cost * T, true end
    end
    for w, win in ipairs(windows) do
      local e = earliest_among(sends[w], win.n, win.len, at, cost)
      if e > at then at, moved = e, true end
    end
    if not moved then return at end
  end
end

-- rules.Record.Made: each window's sends made (its sent list: windows[i].sent), or false
-- if they are not known: a window that counts sends to come and no send
-- made (a store written by a build that did not record them).
local function made_lists(windows)
  local out = {}
  for w, win in ipairs(windows) do
    local l = {}
    for k, v in ipairs(redis.call('LRANGE', win.sent, 0, -1)) do l[k] = tonumber(v) end
    if #l == 0 and redis.call('LLEN', win.key) > 0 then return false end
    out[w] = l
  end
  return out
end

-- A tenant's bookings (queue.TenantRecord.Booked): its hash's 'booked'
-- field, "slot cost id" per booking, soonest first, joined by ';'
-- (tenants.go's parseBooked). A list of {slot, cost, id}.
local function booked_parse(f)
  local out = {}
  if not f then return out end
  for slot, cost, id in string.gmatch(f, '(%-?%d+) (%d+) ([^;]+)') do
    out[#out + 1] = {slot = tonumber(slot), cost = tonumber(cost), id = id}
  end
  return out
end

-- Writes list[from..] as tenant hash tk's bookings (none: no field).
local function booked_write(tk, list, from)
  local parts = {}
  for i = from, #list do
    local b = list[i]
    parts[#parts + 1] = string.format('%d %d %s', b.slot, b.cost, b.id)
  end
  if #parts == 0 then
    redis.call('HDEL', tk, 'booked')
  else
    redis.call('HSET', tk, 'booked', table.concat(parts, ';'))
  end
end

-- Drops job id's booking from tenant hash tk (cancelled, expired: it
-- will not be sent there); true if it had one.
local function booked_drop(tk, id)
  local list = booked_parse(redis.call('HGET', tk, 'booked'))
  for i, b in ipairs(list) do
    if b.id == id then
      table.remove(list, i)
      booked_write(tk, list, 1)
      return true
    end
  end
  return false
end

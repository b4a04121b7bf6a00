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
-- ARGV[5]  idle ttl (ms)
-- ARGV[6..] per tenant: its name, its interval, its tolerance ((burst -
--          1) intervals), its number of windows, and per window its key's
--          suffix (leaky.Window.String), N and length
--
-- Returns {now, taken back, {tenant, shift, until, held, next, id, slot,
-- deadline, id, slot, deadline, ...}, ...}: how many jobs it took back,
-- and per tenant its pause, the earliest its next send may go (the last
-- owner's last claim's dispatch time plus its cost in intervals), and its
-- waiting jobs by slot, each with its deadline if its dispatch time is
-- past it (moved by a takeover or a pause) or its tenant is held (else
-- 0): the owner looks at such a job at its deadline, when the claim
-- expires it, not at its dispatch time.
--
-- Every tenant's schedule starts no sooner than its next (see
-- partKeys.recent): its tat is raised to next plus the burst's tolerance,
-- in tenant time, so that the tenant has no burst credit at the takeover
-- (the old owner's last sends may have used it; a frozen old owner may
-- even send late), and a job admitted after it is promised no sooner than
-- the owner's floor lets it go.
--
-- A tenant whose waiting jobs' slots passed while nobody sent them (the
-- partition had no owner: a worker cut off from Redis, or killed) has them
-- moved, and its tat past them, to where the new owner will really send
-- them: from now (or its next, if later; or, if a job taken back may have
-- been written, its cost after now), one interval a cost apart, with no
-- burst credit (the sends before may have used it). A pause that ends
-- after that moves nothing: its end holds them. A held tenant's clock
-- stands still and its resume may come at once: its jobs move only if a
-- job taken back may have been written, past the frozen clock by that
-- job's cost or its last claim's. A tenant's windows hold too: a job
-- taken back counts as a send made at the takeover; where the windows'
-- sends made are known (their sent lists, which finish.lua keeps), every
-- job not booked ahead is placed again from them, in order, at its slot
-- if it still fits (place_anew); else each moved job goes no sooner than
-- its windows allow, counting the old slots, and its new slot is counted
-- in them. So each job says when it goes, and a job admitted
-- after the takeover is promised what it will see, not a slot the backlog
-- has taken. The rule is rules.Respace, which the embedded store's
-- restart follows too (bolt's respaceTenant); only what each can know of
-- the sends before differs (rules.Pickup).

local now = server_now(ARGV[2])
local prefix, idle_ms = ARGV[3], tonumber(ARGV[5])

local taken = 0
if ARGV[4] == '1' then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local jk = prefix .. 'job:' .. id
    local j = redis.call('HMGET', jk, 'state', 'slot', 'tenant', 'attempts', 'cost', 'nb')
    if j[1] == 'dispatching' then
      local tk = prefix .. 'tenant:' .. j[3]
      -- It may have been written at any moment up to now: the tenant's
      -- next send comes its cost in intervals after now (respace, below,
      -- in this run or a later one of the same takeover).
      local cost = at_least(tonumber(j[5]) or 1, 1)
      if cost > (tonumber(redis.call('HGET', tk, 'lost')) or 0) then redis.call('HSET', tk, 'lost', cost) end
      -- Its windows count it at the latest moment it may have been
      -- written, not at its slot (respace, below).
      local unrecorded = redis.call('HGET', tk, 'unrecorded')
      redis.call('HSET', tk, 'unrecorded', (unrecorded and unrecorded .. ',' or '') .. j[2] .. ':' .. cost)
      -- The claim counted an attempt whose outcome nobody recorded: it
      -- is not counted (the resend is that attempt again, as on the
      -- embedded store, whose claims are not written), and a job with no
      -- attempt recorded waits as queued.
      local attempts = math.max((tonumber(j[4]) or 1) - 1, 0)
      -- One booked for its not_before, never attempted, is booked again
      -- (counted in scheduled, as the embedded store's restart has it).
      local state, index, count = attempts > 0 and 'retrying' or 'queued', 'waiting:', 'depth'
      if attempts == 0 and (tonumber(j[6]) or 0) > 0 then state, index, count = 'scheduled', 'sched:', 'scheduled' end
      redis.call('HSET', jk, 'state', state, 'attempts', attempts)
      redis.call('ZREM', prefix .. 'claimed:' .. j[3], id)
      redis.call('ZADD', prefix .. index .. j[3], tonumber(j[2]) or 0, id)
      redis.call('HINCRBY', tk, 'inflight', -1)
      redis.call('HINCRBY', tk, count, 1)
      taken = taken + 1
    end
  end
  redis.call('DEL', KEYS[2])
end

-- Gives list key the time to live of key like (a window's list), and at
-- least a window's length len plus the idle time: the sends it counts
-- last as long as the list beside them.
local function keep_like(key, like, len)
  local ttl = redis.call('PTTL', like)
  keep(key, at_least(ttl, math.floor(len / 1000) + idle_ms))
end

-- rules.placeAnew: every waiting job but those booked from t on is placed
-- again, in order, from the sends made (made: made_lists): at its slot
-- if that still fits, else at the first place from t that the rate, the
-- windows and the bookings allow. The bookings keep their slots. Then the
-- windows' lists hold the sends made, the jobs as placed and the
-- bookings. Returns whether a job moved, and the end of the last one
-- moved (its slot plus its cost in intervals).
local function place_anew(tk, name, waiting, in_sched, T, windows, made, t, real)
  local booked = booked_parse(redis.call('HGET', tk, 'booked'))
  local ahead, kept, placed = {}, {}, {}
  for _, b in ipairs(booked) do
    if b.slot >= t then
      ahead[#ahead + 1] = b
      kept[b.id] = true
    end
  end
  -- Each window's newest n are made[w][head[w]..]: a job placed is at or
  -- after every send counted, so it is appended, in O(1), and the oldest
  -- left behind (Recent.Add would copy them each time).
  local head = {}
  for w in ipairs(windows) do head[w] = 1 end
  local function newest(w)
    local l, out = made[w], {}
    for k = head[w], #l do out[#out + 1] = l[k] end
    return out
  end
  local moved, last = false, t
  for i = 1, #waiting, 2 do
    local id = waiting[i]
    if not kept[id] then
      local slot = tonumber(waiting[i + 1])
      local jk = prefix .. 'job:' .. id
      local cost = at_least(tonumber(redis.call('HGET', jk, 'cost')) or 1, 1)
      local at = at_least(slot, t)
      local ordered = #ahead == 0
      for w in ipairs(windows) do
        local l = made[w]
        if #l >= head[w] and l[#l] > at then ordered = false end -- a send made after it (a clock ahead)
      end
      if ordered then
        -- Every send counted is at or before at: the newest n tell
        -- (windows_slot, on the lists in memory).
        for w, win in ipairs(windows) do
          local size = #made[w] - head[w] + 1
          local out = math.min(size + cost - win.n, size)
          if out > 0 then at = at_least(at, made[w][head[w] + out - 1] + win.len) end
        end
      else
        local views = {}
        for w in ipairs(windows) do views[w] = newest(w) end
        at = place_around(views, windows, ahead, at, cost, T)
      end
      t = at + cost * T
      for w, win in ipairs(windows) do
        local l = made[w]
        if #l >= head[w] and l[#l] > at then
          made[w], head[w] = newest(w), 1
          list_record(made[w], win.n, at, cost)
        else
          for _ = 1, cost do l[#l + 1] = at end
          head[w] = at_least(head[w], #l - win.n + 1)
        end
      end
      placed[id] = true -- an overdue booking: in the schedule now
      if at ~= slot then
        redis.call('ZADD', prefix .. (in_sched[id] and 'sched:' or 'waiting:') .. name, at, id)
        redis.call('HSET', jk, 'slot', at, 'dispatch', real(at))
        waiting[i + 1] = string.format('%d', at) -- as ZRANGE gives it
        moved, last = true, t
      end
    end
  end
  local left = {}
  for _, b in ipairs(booked) do
    if not placed[b.id] then left[#left + 1] = b end
  end
  if #left < #booked then booked_write(tk, left, 1) end
  for w, win in ipairs(windows) do
    local l = newest(w)
    for _, b in ipairs(ahead) do list_record(l, win.n, b.slot, b.cost) end
    local ttl = redis.call('PTTL', win.key)
    redis.call('DEL', win.key)
    if #l > 0 then
      redis.call('RPUSH', win.key, unpack(l))
      keep(win.key, at_least(ttl, math.floor((real(t) - now + win.len) / 1000) + idle_ms))
    end
  end
  return moved, last
end

-- Moves tk's waiting jobs that the takeover makes too soon, and its tat
-- past them (see above; rules.Respace is the rule, and
-- TestLuaTakeoverAgreesWithRules holds the two together): waiting is
-- ZRANGE WITHSCORES, in slot order, and gets their new slots.
local function respace(tk, name, waiting, in_sched, T, tau, windows, shift, untl, held, nxt, tat, lastcost)
  if #waiting == 0 then return end
  local lost = tonumber(redis.call('HGET', tk, 'lost')) or 0
  if lost > 0 then redis.call('HDEL', tk, 'lost') end -- spent here, whatever the pause
  local tnow = tenant_time(tk, now)
  -- The sends taken back may have been written up to now: the windows
  -- count them then (rules.Pickup.Unrecorded).
  local unrecorded = redis.call('HGET', tk, 'unrecorded')
  if unrecorded then
    redis.call('HDEL', tk, 'unrecorded')
    for slot, cost in string.gmatch(unrecorded, '(%d+):(%d+)') do
      windows_written(windows, tonumber(slot), tnow, tonumber(cost))
      -- Made, for all anyone knows: a later takeover counts it too.
      for _, w in ipairs(windows) do
        windows_record({{key = w.sent, n = w.n}}, tnow, tonumber(cost))
        keep_like(w.sent, w.key, w.len)
      end
    end
  end
  local t -- tenant time: the jobs before it move (nil: none does)
  if held > 0 then
    -- Its clock stands still, and the resume may come at once: past the
    -- frozen now by the lost send's cost or the last claim's.
    if lost > 0 then t = tnow + at_least(lost, lastcost) * T end
  else
    local floor = at_least(now, nxt)
    if lost > 0 then floor = at_least(floor, now + lost * T) end -- a write lost in the crash (see above)
    if untl < floor then t = floor - shift end -- else the pause's end holds them all
  end
  -- Their real time (leaky.Pause.Real; held: as if resumed now).
  local function real(slot)
    if held == 0 then return at_least(untl, slot + shift) end
    local u = at_least(untl, now)
    return at_least(u, slot + u - tnow)
  end
  local moved = false
  local made = held == 0 and t ~= nil and #windows > 0 and made_lists(windows)
  if made then
    moved, t = place_anew(tk, name, waiting, in_sched, T, windows, made, t, real)
  end
  for i = 1, #waiting, 2 do
    if made or t == nil or tonumber(waiting[i + 1]) >= t then break end -- on schedule: so are the later ones
    -- Written where the new owner will send it, so that what Job says and
    -- what is sent agree.
    local jk = prefix .. 'job:' .. waiting[i]
    local cost = at_least(tonumber(redis.call('HGET', jk, 'cost')) or 1, 1)
    if #windows > 0 then
      t = windows_slot(windows, t, cost)
      windows_record(windows, t, cost)
    end
    redis.call('ZADD', prefix .. (in_sched[waiting[i]] and 'sched:' or 'waiting:') .. name, t, waiting[i])
    redis.call('HSET', jk, 'slot', t, 'dispatch', real(t))
    booked_drop(tk, waiting[i]) -- a booked retry moved: it is in the schedule now
    waiting[i + 1] = string.format('%d', t) -- as ZRANGE gives it (tostring would round to 14 digits)
    t, moved = t + cost * T, true
  end
  -- The windows' lists live at least as long as they count the moved,
  -- plus the idle time, as admission keeps them (enqueue.lua). Without
  -- it a store whose clock is not Redis's lost them while they still
  -- counted: the model test's clock stands still while Redis's TTLs run,
  -- and a busy machine's second between two crashes let the list lapse,
  -- so the second takeover spaced the job it took back by no window.
  for _, w in ipairs(windows) do
    if moved then keep(w.key, math.floor((real(t) - now + w.len) / 1000) + idle_ms) end
  end
  if moved and t + tau > tat then
    tat = t + tau
    redis.call('HSET', tk, 'tat', tat)
  end
  -- The schedule runs past the last job waiting: jobs admitted while the
  -- partition had no owner were placed at its start (admit.lua), past
  -- the schedule's end; and after a reload to a slower rate the last job
  -- is a new interval from the next. Every takeover applies it, so that
  -- two of one restart agree (one that moved the jobs and one that found
  -- them on schedule). A booked retry is not in it (the jobs admitted
  -- are placed around it: rules.Record.Absorb).
  local booked = {}
  for _, b in ipairs(booked_parse(redis.call('HGET', tk, 'booked'))) do booked[b.id] = true end
  local n = #waiting
  while n > 0 and booked[waiting[n - 1]] do n = n - 2 end
  local last = tonumber(waiting[n]) or 0
  if n > 0 then
    local cost = at_least(tonumber(redis.call('HGET', prefix .. 'job:' .. waiting[n - 1], 'cost')) or 1, 1)
    if last + cost * T > tat then redis.call('HSET', tk, 'tat', last + cost * T) end
  end
end

local out = {now, taken}
local i = 6
while i <= #ARGV do
  local name, T, tau = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local windows = {}
  for w = 1, tonumber(ARGV[i + 3]) do
    local at = i + 4 + (w - 1) * 3
    windows[w] = {key = prefix .. 'window:' .. name .. ':' .. ARGV[at], sent = prefix .. 'sent:' .. name .. ':' .. ARGV[at],
                  n = tonumber(ARGV[at + 1]), len = tonumber(ARGV[at + 2])}
  end
  i = i + 4 + #windows * 3
  local tk = prefix .. 'tenant:' .. name
  local h = redis.call('HMGET', tk, 'shift', 'until', 'held', 'next', 'tat', 'last', 'lastcost')
  local shift, untl, held, nxt = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
  -- By the rate in force, from the last claim: a reload may have slowed
  -- it since next was worked out.
  local last = tonumber(h[6]) or 0
  if last > 0 then nxt = at_least(nxt, last + T * at_least(tonumber(h[7]) or 1, 1)) end
  local r = {name, shift, untl, held, nxt}
  local waiting = redis.call('ZRANGE', prefix .. 'waiting:' .. name, 0, -1, 'WITHSCORES')
  -- With them, in slot order (then id, as ZRANGE has them), the jobs
  -- booked for their not_before: a respace moves one that is overdue,
  -- later, as the embedded store's restart does.
  local in_sched = {}
  local sched = redis.call('ZRANGE', prefix .. 'sched:' .. name, 0, -1, 'WITHSCORES')
  if #sched > 0 then
    local merged, a, b = {}, 1, 1
    while a <= #waiting or b <= #sched do
      local take_sched = a > #waiting
      if not take_sched and b <= #sched then
        local sa, sb = tonumber(waiting[a + 1]), tonumber(sched[b + 1])
        take_sched = sb < sa or (sb == sa and sched[b] < waiting[a])
      end
      if take_sched then
        in_sched[sched[b]] = true
        local n = #merged
        merged[n + 1], merged[n + 2] = sched[b], sched[b + 1]
        b = b + 2
      else
        local n = #merged
        merged[n + 1], merged[n + 2] = waiting[a], waiting[a + 1]
        a = a + 2
      end
    end
    waiting = merged
  end
  -- The jobs are placed anew from the next send: the lateness of the
  -- sends before (behind, finish.lua's) is spent.
  redis.call('HDEL', tk, 'behind')
  respace(tk, name, waiting, in_sched, T, tau, windows, shift, untl, held, nxt, tonumber(h[5]) or 0, at_least(tonumber(h[7]) or 1, 1))
  local floor = nxt - shift + tau -- tenant time
  if floor > tenant_time(tk, now) then -- held: its clock stands still, and so does its credit
    if floor > (tonumber(redis.call('HGET', tk, 'tat')) or 0) then redis.call('HSET', tk, 'tat', floor) end
  end
  -- A job moved past its deadline, by a takeover (this run or an earlier
  -- one of the same or another tenure) or by a pause, or held: the owner
  -- is told the deadline. One HGET per waiting job.
  for w = 1, #waiting, 2 do
    r[#r + 1] = waiting[w]
    r[#r + 1] = waiting[w + 1]
    r[#r + 1] = missed_deadline(prefix, waiting[w], tonumber(waiting[w + 1]), shift, untl, held)
  end
  out[#out + 1] = r
end
return out

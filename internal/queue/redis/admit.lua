-- One admission decision for one tenant, atomically: the Lua port of
-- rules.Admit (internal/rules/admit.go), checked against it on random
-- sequences (admit_lua_test.go). Run by enqueue.lua (enqueue.go), which
-- loads it as its function admit_decision.
--
-- Times are whole microseconds: Lua numbers are doubles, exact to 2^53, so
-- microseconds since 1970 are exact and nanoseconds would not be. Slots and
-- TAT are in tenant time (real time minus the pauses so far, see
-- internal/leaky/pause.go).
--
-- KEYS[1]    the tenant's hash: tat, shift, until, held, depth, booked,
--            behind (rules.Record.Behind, real time; 0 or absent: none)
-- KEYS[2]    the tenant's waiting jobs (a zset: id -> slot), not yet claimed
-- KEYS[3]    the tenant's claimed jobs (a zset: id -> slot), being sent
-- KEYS[4..]  one list per window: the slots of its last N sends, oldest first
-- ARGV[1]    now (0: the server's TIME, one clock for every process)
-- ARGV[2]    lag: how long a send takes to start
-- ARGV[3]    interval
-- ARGV[4]    burst
-- ARGV[5]    capacity
-- ARGV[6]    cost
-- ARGV[7]    waiting: the jobs ahead (-1: the hash's depth). With windows
--            (and a capacity) the jobs that really wait are counted from
--            KEYS[2] and KEYS[3] instead: depth drops when a job is claimed,
--            a lead before its slot, and a job may wait for a window long
--            after its slot of the rate.
-- ARGV[8]    commit: 1 keeps the decision, 0 only tells it
-- ARGV[9]    deadline ('': none; any number is one, before 1970 too)
-- ARGV[10]   the downstream ceiling's interval (0: no ceiling)
-- ARGV[11]   the downstream ceiling's burst
-- ARGV[12..] n and length of each window
-- HELD_RETRY_AFTER  rules.HeldRetryAfter, put in front of the script
-- OWNER_AT   (enqueue.lua's third argument) when the tenant's partition
--            gets an owner, 0 if it has one (rules.Call.OwnerAt)
-- OWN_DUE    (enqueue.lua's fourth argument) how many jobs of this batch
--            are in KEYS[2] due by the arrival: they count whole, as jobs
--            not yet in the schedule do (rules.Queue.Waiting)
-- ACCEPTS    (enqueue.lua's fifth argument) true: a job kept counts in
--            the hash's 'accepted', in the write that keeps the decision
--            (a new job; a failed one sent again does not)
-- NOT_BEFORE  (enqueue.lua's sixth argument) the job's not_before, real
--            time (0: none): later than its place in the queue, it is
--            booked there (rules' admitScheduled)
-- MAX_SCHEDULED (enqueue.lua's seventh) the tenant's max_scheduled (0: no
--            bound)
-- JOB_ID     (enqueue.lua's eighth) the job's id, for its booking
-- CAPPED     (enqueue.lua's ninth) true: the tenant or its downstream has
--            a cap on attempts in flight, which may hold due jobs past
--            their slots: they wait, and count, as behind a ceiling
--            (rules.Call.Capped)
-- KEYS[1]'s 'scheduled' counts the jobs so booked, not yet claimed.
-- Run alone (the agreement test), OWNER_AT, OWN_DUE, NOT_BEFORE,
-- MAX_SCHEDULED, JOB_ID and CAPPED ('1' or '0') are the last six ARGV,
-- and ACCEPTS is false.
--
-- Returns {admitted, slot, dispatch_at, retry_after, depth, now, prompt,
-- delay, scheduled}: admitted 1, 0, 3 (it would be sent after its
-- deadline: nothing is kept), 5 (booked for its not_before: the tenant
-- has max_scheduled such jobs; scheduled says how many) or 6 (booked for
-- its not_before, outside the queue's capacity); the slot in tenant time and the real dispatch time
-- (admitted, 3); the real Retry-After (refused); the depth before this
-- job; the time the decision was made at; prompt 1 if it goes at once (no
-- wait, no pause); the expected delay (admitted, 3): until its dispatch
-- time, or longer if the jobs ahead of it at the downstream's ceiling
-- (queue.CeilingDelay) take longer.

local function at_least(a, b) if a > b then return a end return b end
local function at_most(a, b) if a < b then return a end return b end

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local lag, T = tonumber(ARGV[2]), tonumber(ARGV[3])
local burst, capacity = tonumber(ARGV[4]), tonumber(ARGV[5])
local cost = at_least(tonumber(ARGV[6]), 1)
local waiting, commit = tonumber(ARGV[7]), ARGV[8] == '1'
local deadline = tonumber(ARGV[9]) -- nil: none
local ceiling_T, ceiling_burst = tonumber(ARGV[10]), tonumber(ARGV[11])

local h = redis.call('HMGET', KEYS[1], 'tat', 'shift', 'until', 'held', 'depth', 'booked', 'behind', 'accepted', 'scheduled')
local tat = tonumber(h[1]) or 0
local shift, untl, held = tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0
local depth = tonumber(h[5]) or 0
if waiting < 0 then waiting = depth end
local paused = held > 0 or now < untl

-- Tenant time (leaky.Pause.TenantTime).
local function tenant_time(t)
  if held > 0 and held < t then t = held end
  if t < untl then t = untl end
  return t - shift
end
-- Real time of a slot; for a held tenant, as if resumed now (dispatchAt).
local function real(slot)
  if held == 0 then return at_least(untl, slot + shift) end
  local frozen = tenant_time(now)
  local u = at_least(untl, now)
  return at_least(u, slot + (u - frozen))
end

-- Real time t in tenant time, for a held tenant as if resumed now
-- (rules' tenantAt, leaky.Pause.Resume).
local function tenant_at(t)
  local s, u = shift, untl
  if held > 0 then
    u = at_least(untl, now)
    s = u - tenant_time(now)
  end
  return at_least(t, u) - s
end

local tnow = tenant_time(now)
local arrival = tnow + lag
local tau = (burst - 1) * T

-- The windows' bookkeeping.
local windows = {}
for i = 4, #KEYS do
  local k = 12 + (i - 4) * 2
  windows[#windows + 1] = {key = KEYS[i], n = tonumber(ARGV[k]), len = tonumber(ARGV[k + 1])}
end

-- With windows, the jobs that wait at the arrival (rules' waitingAt):
-- those due later, claimed or not, and while paused or behind a ceiling
-- those due already and not claimed. Slots are whole microseconds: "later
-- than arrival" is "at arrival + 1 or later".
local windowed = #windows > 0 and capacity > 0
local due_waits = paused or ceiling_T > 0 or CAPPED
if windowed then
  waiting = redis.call('ZCOUNT', KEYS[2], arrival + 1, '+inf') + redis.call('ZCOUNT', KEYS[3], arrival + 1, '+inf')
  if due_waits then waiting = waiting + redis.call('ZCOUNT', KEYS[2], '-inf', arrival) end
end
-- How many of the depth still count at the arrival (rules'
-- countedAtArrival): a job due by then leaves as the owner claims it,
-- unless paused or behind a ceiling; this batch's own count whole.
local function counted_at_arrival()
  if paused or ceiling_T > 0 or CAPPED then return waiting end
  return waiting - (redis.call('ZCOUNT', KEYS[2], '-inf', arrival) - OWN_DUE)
end

-- When fewer than n of the jobs counted above still wait (a refusal's
-- Retry-After): the slot of the one that leaves n behind it, 0 if fewer
-- wait already. Read only for a refusal: O(jobs waiting).
local function until_fewer(n)
  if windowed then
    local slots = {}
    local function add(reply) for i = 2, #reply, 2 do slots[#slots + 1] = tonumber(reply[i]) end end
    add(redis.call('ZRANGEBYSCORE', KEYS[2], arrival + 1, '+inf', 'WITHSCORES'))
    add(redis.call('ZRANGEBYSCORE', KEYS[3], arrival + 1, '+inf', 'WITHSCORES'))
    if due_waits then add(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', arrival, 'WITHSCORES')) end
    if #slots < n then return 0 end
    table.sort(slots)
    return slots[#slots - n + 1]
  end
  if redis.call('ZCARD', KEYS[2]) < n then return 0 end
  return tonumber(redis.call('ZRANGE', KEYS[2], -n, -n, 'WITHSCORES')[2])
end
-- The Retry-After (tenant time, from tnow) of a refusal by count until
-- that slot. A job due already and still counted leaves as soon as the
-- owner claims it: 0. One held past its slot by a ceiling leaves when the
-- ceiling lets it, which no slot says: one interval, as a guess.
local function count_retry(n)
  local s = until_fewer(n)
  if s > tnow then return s - tnow end
  if ceiling_T > 0 and not paused then return T end
  return 0
end
local function window_slot(at) return windows_slot(windows, at, cost) end

-- queue.TenantRecord.Absorb: the job is placed around the retries
-- booked ahead (their backoff ends past their place); each booking it
-- would pass or crowd joins the schedule first. An admission keeps that.
local booked = booked_parse(h[6])
local absorbed
tat, absorbed = absorb(booked, 0, arrival, tat, tau, T, cost, windows, #windows > 0 and capacity > 0)

-- rules' admitScheduled: a not_before later than the job's place in the
-- queue books it there, at the first slot the windows and the other
-- bookings allow (Record.clearOfBookings); the schedule's end does not
-- move for it (the absorb above is not kept), max_scheduled bounds it.
local nb = 0
if NOT_BEFORE > 0 then
  nb = tenant_at(NOT_BEFORE)
  -- no sender before OWNER_AT, which sends the jobs ahead first
  if OWNER_AT > 0 then nb = at_least(nb, tenant_at(OWNER_AT + depth * T)) end
  if nb <= at_least(arrival, tat - tau) then nb = 0 end -- its place comes later: an ordinary job
end
if nb > 0 then
  local scheduled = tonumber(h[9]) or 0
  local slot = nb
  if #windows > 0 then slot = window_slot(slot) end
  slot = clear_of_bookings(booked, 1, slot, cost, T, windows)
  local dispatch = real(slot)
  local delay = at_least(dispatch - now, 0)
  -- A deadline before it first, whatever the room: it could never go.
  if deadline and dispatch > deadline then return {3, slot, dispatch, 0, depth, now, 0, delay, scheduled} end
  if MAX_SCHEDULED > 0 and scheduled >= MAX_SCHEDULED then
    return {5, 0, 0, 0, depth, now, 0, 0, scheduled}
  end
  if commit then
    local i = #booked + 1
    while i > 1 and booked[i - 1].slot > slot do i = i - 1 end
    table.insert(booked, i, {slot = slot, cost = cost, id = JOB_ID})
    booked_write(KEYS[1], booked, 1)
    local fields = {'scheduled', scheduled + 1}
    if ACCEPTS then fields[#fields + 1] = 'accepted'; fields[#fields + 1] = (tonumber(h[8]) or 0) + 1 end
    redis.call('HSET', KEYS[1], unpack(fields))
    windows_record(windows, slot, cost)
  end
  return {6, slot, dispatch, 0, depth, now, 0, delay, scheduled + 1}
end

-- leaky.Decide.
local admitted, slot, retry, newtat = false, 0, 0, tat
local earliest = at_least(arrival, tat - tau)
if #windows == 0 or capacity == 0 then
  local excess = at_least(tat, arrival) + (cost - 1) * T - arrival - tau
  if excess > capacity * T then
    retry = excess - capacity * T
    -- token mode: a full window may refuse it for longer than the rate
    if #windows > 0 then retry = window_slot(arrival + retry) - arrival end
    -- counted from now, as if the lag were nil: it holds whatever the
    -- lag estimate does by the time the job comes back
    retry = retry + lag
  else
    admitted, slot, newtat = true, earliest, at_least(tat, arrival) + cost * T
    if #windows > 0 then -- token mode: a window's hold means no
      local ws = window_slot(slot)
      if ws > slot then admitted, retry, newtat = false, ws - arrival + lag, tat end
    end
  end
elseif waiting >= capacity + burst then
  retry = count_retry(capacity + burst) -- room comes when enough have gone
else
  slot = window_slot(earliest)
  newtat = at_least(at_least(tat, arrival) + cost * T, slot + cost * T)
  admitted = true
end

-- The store's own bound. With windows: a job that would wait is refused
-- when capacity jobs wait already, until fewer do. Without: a paused
-- tenant sends nothing at once, so capacity wait; room comes when fewer
-- than capacity and burst wait (a pause's end is added below).
if windowed then
  if admitted and (paused or slot > arrival) and waiting >= capacity then
    admitted, retry, newtat = false, count_retry(capacity), tat
  end
else
  local room = capacity + burst
  if paused then room = capacity end
  if waiting >= room and counted_at_arrival() >= room then
    -- Refused by the rate too (retries booked past their places fill
    -- the room): the later of the two.
    admitted, retry, newtat = false, at_least(retry, count_retry(capacity + burst)), tat
  end
end

if not admitted then
  local after = real(tnow + retry) - now
  -- rules.HeldRetryAfter: a hold has no end to count to, and nothing
  -- leaves until an operator resumes it.
  if held > 0 then after = at_least(after, HELD_RETRY_AFTER) end
  return {0, 0, 0, after, depth, now, 0, 0, 0}
end
-- queue.CeilingDelay: the jobs ahead go no faster than the ceiling.
local dispatch = real(slot)
-- A partition without an owner sends nothing until OWNER_AT; its owner
-- then sends the jobs from then on, one interval apart, in order, those
-- ahead of this one first (each counted at cost 1). The slot moves there
-- too: an owner that comes in time (OWNER_AT counts what its start may
-- take) finds the job on schedule and sends it then, not at once, so the
-- promise holds both ways, as a prompt job's start lag does. The
-- schedule's end (tat) stays: it bounds the queue, and the wait for an
-- owner is not the queue's; takeover.lua moves it past the jobs it finds.
-- A paused tenant is moved by its pause, not by the takeover.
if OWNER_AT > 0 and not paused and OWNER_AT + depth * T > dispatch then
  dispatch = OWNER_AT + depth * T
  slot = dispatch - shift
end
-- Behind a queue running late it goes when the sends ahead let it
-- (rules.Record.RunLate), not at its slot: its promise says so, and the
-- next job admitted comes its cost after it.
local behind = tonumber(h[7]) or 0
local late = behind > dispatch
local delay = at_least(behind, dispatch) - now
if ceiling_T > 0 and depth > 0 then delay = at_least(delay, at_least(0, depth + 1 - ceiling_burst) * ceiling_T) end
if deadline and now + delay > deadline then
  return {3, slot, dispatch, 0, depth, now, 0, delay, 0}
end
if commit then
  local fields = {'tat', newtat, 'depth', depth + 1}
  if late then fields[#fields + 1] = 'behind'; fields[#fields + 1] = behind + cost * T end
  if ACCEPTS then fields[#fields + 1] = 'accepted'; fields[#fields + 1] = (tonumber(h[8]) or 0) + 1 end
  redis.call('HSET', KEYS[1], unpack(fields))
  if absorbed > 0 then booked_write(KEYS[1], booked, absorbed + 1) end
  windows_record(windows, slot, cost)
end
local prompt = 0
if slot <= arrival and held == 0 and now >= untl and dispatch == real(slot) then prompt = 1 end
return {1, slot, dispatch, 0, depth, now, prompt, delay, 0}

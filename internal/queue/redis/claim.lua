-- Claims a batch of due jobs of one partition for their owner, each for
-- one attempt: Store.claimBatch (claim.go). Each job's decision, and what
-- it does to its tenant (next, last, recent, expired, bookings) and to the
-- record's retention (settle), is the Lua port of rules.Claim
-- (internal/rules/claim.go) and rules.KeepRecord, checked against them on
-- random sequences (claim_lua_test.go). Fenced (owner.FenceLua is put in
-- front): only the partition's owner, in its epoch, claims. Keys are built
-- from the partition's prefix (its hash tag: the slot of KEYS).
-- Microseconds.
--
-- KEYS[1]  the partition's lease (the fence)
-- KEYS[2]  the partition's active-tenants zset
-- KEYS[3]  the partition's jobs being sent (zset: id -> slot)
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  now (0: the server's TIME)
-- ARGV[3]  horizon: claim a job this long before its dispatch time
-- ARGV[4]  retention (ms)
-- ARGV[5]  held recheck: how soon a held tenant's job looks again
-- ARGV[6]  the partition's key prefix (partKeys.tag)
-- ARGV[7]  idle ttl (ms)
-- ARGV[8]  the owner's clock margin (Store.clockMargin): it waits for a
--          dispatch time on its reading of Redis's clock, which may be
--          this early
-- ARGV[9..] per job: its id, its tenant, the tenant's interval (a new
--          owner sends the tenant's next job no earlier than this job's
--          dispatch time plus its cost times the interval, plus the
--          margin), its burst's tolerance (a new owner gives it no
--          burst credit until that much after: partKeys.recent), and '1'
--          if its tenant's admission counts the jobs being sent by slot
--          (rules.CountsWaiting: then the claimed set keeps it)
--
-- Returns {now, reply, ...}, one reply per job, each
--   {code, wait, dispatch_at, attempts, field, value, ...}, code one of
--   0  drop it: the job is gone, done, or being sent already
--   1  not yet: come back in wait (a pause moved it)
--   2  claimed: its dispatch time, its attempts now, and its hash (but
--      'resp', the answer kept of the last attempt)
--   3  expired: its deadline came before it could go
--   5  its tenant is held: look again in wait

local now = server_now(ARGV[2])
local horizon, retention, recheck = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local prefix, idle_ms, margin = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])

-- Each tenant's hash, read once: its pause, and what the batch changes.
-- Its last claim is the one that goes last, whichever batch claimed it: a
-- later batch may claim a job that goes sooner (a burst admitted since, a
-- retry), and the takeover spaces the next send from the last to go.
local tenant_of, tenants = tenant_batch(prefix,
  {{'shift', 'shift'}, {'until', 'untl'}, {'held', 'held'}, {'depth', 'depth'}, {'inflight', 'inflight'}, {'next', 'next'}, {'tat', 'tat'},
   {'last', 'last'}, {'lastcost', 'last_cost'}, {'scheduled', 'scheduled'}},
  function(t)
    t.claimed, t.expired, t.tau, t.last_cost = 0, 0, 0, at_least(t.last_cost, 1)
    -- The batch's claims of the tenant, moved from its waiting set (or
    -- its set of jobs booked for their not_before: booked) to its
    -- claimed set by one command each (taken: ids; places: slot, id).
    t.taken, t.places, t.booked = {}, {}, {}
    -- Of the claimed and expired, those that were booked: counted in
    -- scheduled, not in depth.
    t.from_sched = 0
  end)

local expired = {}
local function expire(jk, id, t, key, booked)
  redis.call('HSET', jk, 'state', 'expired', 'fin', now, 'err', 'expired: its deadline passed before it could be sent')
  expired[#expired + 1] = id
  redis.call('PEXPIRE', jk, retention)
  if key and key ~= '' then redis.call('PEXPIRE', idem_key(prefix, t.name, key), retention) end
  if booked then
    redis.call('ZREM', prefix .. 'sched:' .. t.name, id)
    t.from_sched = t.from_sched + 1
  else
    redis.call('ZREM', prefix .. 'waiting:' .. t.name, id)
  end
  booked_drop(t.key, id) -- never sent: nothing to place around
  t.expired = t.expired + 1
end

local out = {now}
local sending = {} -- score, member, ...: one ZADD for the batch
for i = 9, #ARGV, 5 do
  local id, tname, interval, tau = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local counted = ARGV[i + 4] == '1'
  local jk = prefix .. 'job:' .. id
  local all = redis.call('HGETALL', jk)
  local j = {}
  for f = 1, #all, 2 do j[all[f]] = all[f + 1] end
  local reply
  if j.state ~= 'queued' and j.state ~= 'retrying' and j.state ~= 'scheduled' then
    reply = {0, 0, 0, 0}
  else
    local t = tenant_of(tname)
    local booked = j.state == 'scheduled' -- counted in scheduled, indexed in sched
    local slot = tonumber(j.slot) or 0
    -- '' or none: no deadline; '0' too (builds before this one wrote it
    -- for none, and admission refuses a deadline at 1970 exactly).
    local deadline = tonumber(j.deadline)
    if deadline == 0 then deadline = nil end
    if t.held > 0 and deadline and now > deadline then
      -- Its deadline passed while its tenant was held: it would be sent
      -- too late whenever the resume comes.
      expire(jk, id, t, j.key, booked)
      reply = {3, 0, 0, 0}
    elseif t.held > 0 then
      -- Held by an operator: look again at the next multiple of the
      -- recheck, plus the job's place in the schedule, so that after a
      -- resume the tenant's jobs come back in slot order; or just past
      -- its deadline, if that comes first, to expire it then.
      local frozen = at_least(t.untl, t.held) - t.shift
      local wait = recheck - now % recheck + at_least(0, slot - frozen)
      if deadline and deadline + 1 - now < wait then wait = deadline + 1 - now end
      reply = {5, wait, 0, 0}
    else
      local dispatch_at = at_least(t.untl, slot + t.shift)
      if deadline and dispatch_at > deadline and now >= deadline then
        expire(jk, id, t, j.key, booked)
        reply = {3, 0, 0, 0}
      elseif deadline and now > deadline then
        -- Its deadline passed while its tenant's pace held it (the rate in
        -- force after a reload, say): it would be sent too late.
        expire(jk, id, t, j.key, booked)
        reply = {3, 0, 0, 0}
      elseif deadline and dispatch_at > deadline then
        -- It will miss its deadline (a pause moved it): it waits, and
        -- counts, until then, as on the embedded store.
        reply = {1, deadline - now, dispatch_at, 0}
      elseif dispatch_at - now > horizon then
        local wait = dispatch_at - now - horizon
        if deadline and deadline - now < wait then wait = deadline - now end
        reply = {1, wait, dispatch_at, 0}
      else
        local attempts = (tonumber(j.attempts) or 0) + 1
        redis.call('HSET', jk, 'state', 'dispatching', 'dispatch', dispatch_at, 'attempts', attempts)
        if booked then
          t.booked[#t.booked + 1] = id
          t.from_sched = t.from_sched + 1
        else
          t.taken[#t.taken + 1] = id
        end
        if counted then
          t.places[#t.places + 1] = slot
          t.places[#t.places + 1] = id
        end
        sending[#sending + 1] = slot
        sending[#sending + 1] = id
        t.claimed = t.claimed + 1
        local after = dispatch_at + interval * at_least(tonumber(j.cost) or 1, 1)
        t.next = at_least(t.next, after + margin)
        t.tau = tau
        if dispatch_at >= t.last then t.last, t.last_cost = dispatch_at, at_least(tonumber(j.cost) or 1, 1) end
        reply = {2, 0, dispatch_at, attempts}
        -- The hash but the answer kept of the last attempt (up to 1 MiB),
        -- which the attempt does not need.
        for f = 1, #all, 2 do
          if all[f] ~= 'resp' then
            reply[#reply + 1] = all[f]
            reply[#reply + 1] = all[f + 1]
          end
        end
      end
    end
  end
  out[#out + 1] = reply
end

if #sending > 0 then redis.call('ZADD', KEYS[3], unpack(sending)) end

local recent, recent_until, recent_add = prefix .. 'recent', 0, {}
for _, t in ipairs(tenants) do
  if t.claimed > 0 then
    if #t.taken > 0 then redis.call('ZREM', prefix .. 'waiting:' .. t.name, unpack(t.taken)) end
    if #t.booked > 0 then redis.call('ZREM', prefix .. 'sched:' .. t.name, unpack(t.booked)) end
    if #t.places > 0 then redis.call('ZADD', prefix .. 'claimed:' .. t.name, unpack(t.places)) end
    -- With the last claim, which a takeover spaces the next send from by
    -- the rate then in force (a reload may slow it after next was worked
    -- out).
    redis.call('HSET', t.key, 'depth', t.depth - t.claimed - t.expired + t.from_sched, 'inflight', t.inflight + t.claimed, 'next', t.next,
      'last', t.last, 'lastcost', t.last_cost, 'scheduled', t.scheduled - t.from_sched)
    -- Until its next send plus its tolerance, a takeover must not give it
    -- burst credit, whatever its schedule says: a reload may raise the
    -- tolerance (or slow the rate) before the takeover. (One ZADD for
    -- the batch, below.)
    recent_add[#recent_add + 1] = t.next + t.tau
    recent_add[#recent_add + 1] = t.name
    recent_until = at_least(recent_until, t.next + t.tau)
  elseif t.expired > 0 then
    redis.call('HSET', t.key, 'depth', t.depth - t.expired + t.from_sched, 'inflight', t.inflight, 'next', t.next,
      'scheduled', t.scheduled - t.from_sched)
  end
  if t.expired > 0 then
    redis.call('HINCRBY', t.key, 'expired', t.expired)
    for _ = 1, t.expired do inactive(KEYS[2], t.name) end
    settle(t.key, now, idle_ms)
  end
end
if recent_until > 0 then
  redis.call('ZADD', recent, unpack(recent_add))
  redis.call('ZREMRANGEBYSCORE', recent, '-inf', now) -- past: nothing to space from
  keep(recent, math.floor((recent_until - now) / 1000) + idle_ms) -- gone once none of it matters, as its tenants' hashes
end
owe_callbacks(prefix, expired, now)
tell_finished(expired)
return out

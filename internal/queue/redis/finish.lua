-- Records a batch of attempts that ended their jobs (sent and answered
-- 2xx, or failed for good) for the partition's owner, in one round trip:
-- Store.finishBatch (outcome.go). It is the Lua port of rules.Finish for
-- those outcomes (internal/rules/finish.go: the job's end, its tenant's
-- counters and next) and of rules.KeepRecord, checked against them on
-- random sequences (finish_lua_test.go). Outcomes that change a tenant's
-- schedule (a retry, a pushback, a release) go through the Go rule instead
-- (rules.Finish, in Store.finishByRule). Fenced (owner.FenceLua is
-- put in front): a stale owner's outcomes are refused, and the job goes
-- again from its new owner with the same Idempotency-Key. Keys are built
-- from the partition's prefix. Microseconds.
--
-- KEYS[1]  the partition's lease (the fence)
-- KEYS[2]  the partition's active-tenants zset
-- KEYS[3]  the partition's jobs being sent
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  now (0: the server's TIME)
-- ARGV[3]  retention (ms)
-- ARGV[4]  idle ttl (ms)
-- ARGV[5]  the partition's key prefix (partKeys.tag)
-- ARGV[6..] per job: id, tenant, state ('succeeded' | 'failed'), sent at
--          (0: not sent), status, error, idempotency key ('' none),
--          the earliest the tenant's next send may go after it (its real
--          write plus its cost in intervals, rules.AfterWrite; 0: not
--          sent), the answer kept of the attempt (JSON, field 'resp';
--          '' none: the one before stays), and, if it was written more
--          than rules.LateEnough after its dispatch time, the write plus
--          an interval for its cost and for each of its tenant's jobs
--          handed over and not yet written (0: on time), the tenant's
--          interval, and '1' if its tenant's admission counts the jobs
--          being sent by slot (rules.CountsWaiting: its claimed set is
--          kept), then its tenant's number of windows and per window its
--          key's suffix (leaky.Window.String), N and length
--
-- A send made counts in its tenant's windows' sends made (their sent
-- lists: rules.Record.CountMade), at its slot or its write if later.
--
-- A late write moves the tenant's behind (rules.Record.RunLate) on to
-- when the jobs behind it can go: an interval more for each job still
-- waiting. admit.lua promises from there.
--
-- The tenant's next (claim.lua's: the last claim's dispatch time plus its
-- cost in intervals) moves on to the last of those: a write comes when it
-- comes, later than its dispatch time under load, and the next owner
-- after a clean handover (takeover.lua) starts the tenant from next.
--
-- Returns {recorded, ...} per job: 1, or 0 if the job was not being sent.

local now = server_now(ARGV[2])
local retention, idle_ms, prefix = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]

local tenant_of, tenants = tenant_batch(prefix,
  {{'shift', 'shift'}, {'until', 'untl'}, {'held', 'held'}, {'depth', 'depth'}, {'inflight', 'inflight'},
   {'tat', 'tat'}, {'delivered', 'delivered_before'}, {'failed', 'failed_before'}, {'next', 'next'},
   {'behind', 'behind'}, {'scheduled', 'scheduled'}},
  function(t) t.after, t.delivered, t.failed, t.last_slot, t.new_behind = 0, 0, 0, 0, 0 end)

local out, ended, callbacks = {}, {}, {}
local i = 6
while i <= #ARGV do
  local id, tname, state = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local sent, status, err, key = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local after = tonumber(ARGV[i + 7]) or 0
  local resp = ARGV[i + 8]
  local late, interval = tonumber(ARGV[i + 9]) or 0, tonumber(ARGV[i + 10]) or 0
  local jk = prefix .. 'job:' .. id
  local j = redis.call('HMGET', jk, 'state', 'slot', 'sent', 'status', 'cbu', 'cbon', 'cost')
  if j[1] ~= 'dispatching' then
    out[#out + 1] = 0
  else
    if sent == '0' then sent = j[3] or '0' end
    if status == '0' then status = j[4] or '0' end
    redis.call('HSET', jk, 'state', state, 'fin', now, 'sent', sent, 'status', status, 'err', err)
    if resp ~= '' then redis.call('HSET', jk, 'resp', resp) end
    redis.call('PEXPIRE', jk, retention)
    if key ~= '' then redis.call('PEXPIRE', idem_key(prefix, tname, key), retention) end
    local t = tenant_of(tname)
    t.counted = t.counted or ARGV[i + 11] == '1'
    t.last_slot = at_least(t.last_slot, tonumber(j[2]) or 0)
    t.after = at_least(t.after, after)
    if late > 0 then t.new_behind = at_least(t.new_behind, late + t.depth * interval) end
    if state == 'succeeded' then
      t.delivered = t.delivered + 1
    else
      t.failed = t.failed + 1
      local fk = prefix .. 'failed:' .. tname
      redis.call('ZADD', fk, now, id)
      redis.call('ZREMRANGEBYSCORE', fk, '-inf', now - retention * 1000)
      redis.call('PEXPIRE', fk, retention)
    end
    if ARGV[i + 3] ~= '0' then -- this attempt was written
      -- Tenant time (leaky.Pause.TenantTime) of the write.
      local wrote = tonumber(ARGV[i + 3])
      if t.held > 0 and t.held < wrote then wrote = t.held end
      if wrote < t.untl then wrote = t.untl end
      local at = at_least(tonumber(j[2]) or 0, wrote - t.shift)
      for w = 1, tonumber(ARGV[i + 12]) do
        local suffix, n, len = ARGV[i + 10 + w * 3], tonumber(ARGV[i + 11 + w * 3]), tonumber(ARGV[i + 12 + w * 3])
        local sk = prefix .. 'sent:' .. tname .. ':' .. suffix
        windows_record({{key = sk, n = n}}, at, at_least(tonumber(j[7]) or 1, 1))
        keep(sk, at_least(redis.call('PTTL', prefix .. 'window:' .. tname .. ':' .. suffix), math.floor(len / 1000) + idle_ms))
      end
    end
    out[#out + 1] = 1
    ended[#ended + 1] = id
    callbacks[id] = {j[5], j[6], state}
  end
  i = i + 13 + 3 * tonumber(ARGV[i + 12])
end
if #ended > 0 then redis.call('ZREM', KEYS[3], unpack(ended)) end -- one command for the batch
owe_callbacks(prefix, ended, now, callbacks)
tell_finished(ended)

local idle = {} -- the tenants left with no jobs: one ZREM for the batch
for _, t in ipairs(tenants) do
  local n = t.delivered + t.failed
  local inflight = at_least(0, t.inflight - n)
  -- The counters as HINCRBY would leave them, in the same HSET (read
  -- with the hash above: one command fewer per tenant).
  local fields = {'inflight', inflight}
  if t.delivered > 0 then fields[#fields + 1] = 'delivered'; fields[#fields + 1] = t.delivered_before + t.delivered end
  if t.failed > 0 then fields[#fields + 1] = 'failed'; fields[#fields + 1] = t.failed_before + t.failed end
  if t.after > t.next then fields[#fields + 1] = 'next'; fields[#fields + 1] = t.after end
  if t.new_behind > t.behind then fields[#fields + 1] = 'behind'; fields[#fields + 1] = t.new_behind end
  redis.call('HSET', t.key, unpack(fields))
  -- Tenant time (leaky.Pause.TenantTime).
  local tnow = now
  if t.held > 0 and t.held < tnow then tnow = t.held end
  if tnow < t.untl then tnow = t.untl end
  if t.counted then leave_claimed(prefix .. 'claimed:' .. t.name, t.last_slot, tnow - t.shift, idle_ms) end
  -- Its count in the active set is its jobs (depth, scheduled and in
  -- flight, which settle reads too): none left, it leaves the set without
  -- counting down.
  local jobs = t.depth + t.scheduled + inflight
  if jobs <= 0 or tonumber(redis.call('ZINCRBY', KEYS[2], -n, t.name)) <= 0 then idle[#idle + 1] = t.name end
  settle_known(t.key, now, idle_ms, jobs, t.held, t.tat, t.shift, t.untl)
end
if #idle > 0 then redis.call('ZREM', KEYS[2], unpack(idle)) end
return out

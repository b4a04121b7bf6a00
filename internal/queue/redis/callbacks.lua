-- Takes the owed callbacks of one partition that are due, each for one
-- attempt: Store.DueCallbacks (callbacks.go). Each taken is due again a
-- lease later, so that no other process takes it meanwhile, and one that
-- dies while sending leaves it to be taken then. Microseconds.
--
-- KEYS[1]  the partition's callbacks (zset: id -> when next due)
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  the lease
-- ARGV[3]  at most this many
-- ARGV[4]  the partition's key prefix (partKeys.tag)
--
-- Returns one reply per callback taken: its job's hash but the payload
-- (field, value, ...). A callback whose job is gone (past retention) or no
-- longer owes one is dropped.

local now = server_now(ARGV[1])
local lease, prefix = tonumber(ARGV[2]), ARGV[4]
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))) do
  local jk = prefix .. 'job:' .. id
  if redis.call('HGET', jk, 'cbs') ~= 'pending' then
    redis.call('ZREM', KEYS[1], id)
  else
    redis.call('ZADD', KEYS[1], now + lease, id)
    redis.call('HSET', jk, 'cbn', now + lease)
    local all = redis.call('HGETALL', jk)
    local r = {}
    for f = 1, #all, 2 do
      if all[f] ~= 'payload' then
        r[#r + 1] = all[f]
        r[#r + 1] = all[f + 1]
      end
    end
    out[#out + 1] = r
  end
end
return out

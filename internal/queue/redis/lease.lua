-- Renews a live worker's leases on the jobs it holds (see recover.lua):
-- the renewer (renewer.go).
--
-- KEYS[1]    the shard's in-flight zset (job id -> lease end)
-- ARGV[1]    now (0: the server's TIME)
-- ARGV[2]    lease
-- ARGV[3..]  the ids of the jobs held
--
-- Returns how many ids it was given. A job no longer in the set (finished,
-- or taken back) is not put back.
local now = server_now(ARGV[1])
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[i])
end
return #ARGV - 2

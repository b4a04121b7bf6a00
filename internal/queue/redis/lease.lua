-- Renews a live worker's leases on the jobs it is sending (see recover.lua).
-- KEYS 1 in-flight zset; ARGV 1 now (0: the server's TIME), 2 lease, 3.. ids
local now = server_now(ARGV[1])
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[i])
end
return #ARGV - 2

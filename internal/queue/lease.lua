-- Renews a live worker's leases on the jobs it is sending (see recover.lua).
-- KEYS 1 in-flight zset; ARGV 1 now (0: the server's TIME), 2 lease, 3.. ids
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[i])
end
return #ARGV - 2

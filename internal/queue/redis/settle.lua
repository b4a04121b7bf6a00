-- settle (lib.lua) on its own, for a change made elsewhere (a hold, a
-- resume). KEYS 1 tenant hash; ARGV 1 now (0: the server's TIME), 2 idle ttl (ms)
if redis.call('EXISTS', KEYS[1]) == 1 then settle(KEYS[1], server_now(ARGV[1]), tonumber(ARGV[2])) end
return 1

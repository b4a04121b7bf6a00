-- settle (lib.lua) on its own, for a change made elsewhere: a hold or a
-- resume (Store.Pause, Store.Resume in hold.go).
--
-- KEYS[1]  the tenant's hash
-- ARGV[1]  now (0: the server's TIME)
-- ARGV[2]  idle ttl (ms)
--
-- Returns 1.
if redis.call('EXISTS', KEYS[1]) == 1 then settle(KEYS[1], server_now(ARGV[1]), tonumber(ARGV[2])) end
return 1

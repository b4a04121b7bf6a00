-- Keeps or drops one tenant's policy as the API set it, and notes the
-- change so that every process finds it (Store.PolicyChanges). Run by
-- Store.PutPolicy and Store.DropPolicy (policies.go).
--
-- KEYS[1]  the layers (hash: tenant -> JSON)
-- KEYS[2]  the change counter
-- KEYS[3]  the changes (zset: tenant -> the change that last touched it)
-- ARGV[1]  the tenant
-- ARGV[2]  its layer ('' drops it)
--
-- Returns {had, change}: had 1 if the tenant had a layer before (0: not),
-- and the change this is (0: none, a drop of nothing).

local had = redis.call('HEXISTS', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  if had == 0 then return {0, 0} end
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local change = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], change, ARGV[1])
return {had, change}

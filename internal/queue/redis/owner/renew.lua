-- Renews a lease by compare: run by the renewer (renew.go), one call per
-- partition held, pipelined.
--
-- KEYS[1]  the partition's lease
-- ARGV[1]  the owner's token (worker:epoch)
-- ARGV[2]  lease (ms)
--
-- Returns {1} renewed, or {0, holder}: the lease is not this token's (it
-- lapsed, someone else holds it, or Redis lost it): holder is its value,
-- false as "" when there is none.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
return {0, holder or ''}

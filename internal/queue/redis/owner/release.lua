-- Gives a lease back by compare, so the next owner may take the
-- partition at once: run by Manager.release (lease.go), after Drain.
--
-- KEYS[1]  the partition's lease
-- ARGV[1]  the owner's token (worker:epoch)
--
-- Returns {1} released, {0} not this token's (nothing done).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0}

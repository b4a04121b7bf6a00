-- The fence: put in front of every script that writes for an owner
-- (FenceLua, FencedScript in fence.go). Before the script does anything,
-- it refuses unless the partition's lease holds exactly the writer's
-- token: the same worker, the same epoch, not expired. A stale owner's
-- write (its lease lapsed; someone else took the partition, with a new
-- epoch, or nobody yet) is refused, atomically with the write.
--
-- KEYS[1]  the partition's lease (Fence.Key)
-- ARGV[1]  the owner's token (Fence.Token)
-- The script's own keys and arguments follow, from KEYS[2] and ARGV[2],
-- all under the partition's hash tag (one Cluster slot).
--
-- Refuses with the error reply "FENCED <the lease's value>" (Fence.Run
-- returns it as *FencedError).
local fence_holder = redis.call('GET', KEYS[1])
if fence_holder ~= ARGV[1] then
  return redis.error_reply('FENCED ' .. (fence_holder or ''))
end

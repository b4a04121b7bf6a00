-- An owner's read of its partition's arrivals (enqueue.lua's lines "id
-- dispatch_us tenant"): it takes up to a batch off the head of the list.
-- Fenced (owner.FenceLua is put in front): a worker that lost the
-- partition (frozen past its lease, cut off) must not take lines the new
-- owner has to see; its read is refused and the lines stay. Run by the
-- poller (consume.go pollOnce), pipelined over the owned partitions.
--
-- KEYS[1]  the partition's lease (the fence)
-- KEYS[2]  the partition's arrivals (list)
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  the most lines to take
--
-- Returns the lines taken, oldest first ({} if none).

return redis.call('LPOP', KEYS[2], ARGV[2]) or {}

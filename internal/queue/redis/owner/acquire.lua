-- Takes a free partition for a worker: run by Manager.take (lease.go).
-- SET NX PX, and a new epoch for the tenure, in one step.
--
-- KEYS[1]  the partition's lease (string: the owner's token, PX lease)
-- KEYS[2]  the partition's epoch (integer; never expires)
-- ARGV[1]  the worker's id
-- ARGV[2]  lease (ms)
--
-- Returns {code, epoch, holder}, code one of
--   0  held: holder is the lease's value (epoch 0); "" is held vacant
--   1  acquired: the lease holds ARGV[1] .. ':' .. epoch, epoch new
--   2  vacated: Redis had no epoch for the partition. It is new, or Redis
--      lost its data, and then an owner from before may still believe in
--      its lease for up to a lease: the partition is held vacant for one
--      lease first. The epoch is seeded from the server's clock (ms), so
--      epochs go on growing across a loss.
--
-- A new epoch is also never below the server's clock (ms): with appendfsync
-- everysec a killed Redis can lose the INCR of an acquisition, and INCR
-- alone would then hand its epoch out again, to another worker.
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, 0, holder}
end
local t = redis.call('TIME')
local nowMS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], string.format('%d', nowMS))
  redis.call('SET', KEYS[1], '', 'PX', ARGV[2])
  return {2, nowMS, ''}
end
local epoch = redis.call('INCR', KEYS[2])
if epoch < nowMS then
  epoch = nowMS
  redis.call('SET', KEYS[2], string.format('%d', epoch))
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', epoch), 'NX', 'PX', ARGV[2])
return {1, epoch, ''}

-- Takes jobs out of the hand-off set once their asynq tasks are known to
-- exist, unless an entry changed meanwhile (recover.lua put the job back
-- with a new task): that one stays for the next sweep. Run by the sweeper
-- (sweeper.go).
--
-- KEYS[1]    the shard's hand-off zset
-- ARGV[1..]  pairs of a job id and the score it was read with
--
-- Returns how many it took out.
local n = 0
for i = 1, #ARGV, 2 do
  if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or -1) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n

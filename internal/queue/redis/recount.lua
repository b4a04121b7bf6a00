-- Brings the claimed sets of the tenants an owner is sending to to the
-- policies in force now, after a reload (owned.recount): a tenant whose
-- admission now counts the jobs being sent by slot (rules.CountsWaiting)
-- gets its jobs in flight in its set, as their claims would have put
-- them; one that no longer counts them loses the set, which nothing reads
-- then. Fenced (owner.FenceLua is put in front): a stale owner's view of
-- what is in flight is not the new owner's.
--
-- KEYS[1]  the partition's lease (the fence)
-- ARGV[1]  the owner's token (the fence)
-- ARGV[2]  the partition's key prefix (partKeys.tag)
-- ARGV[3..] per tenant: its name, '1' if it counts them ('0' if not), n,
--          then n pairs of slot and job id

local prefix = ARGV[2]
local i = 3
while i <= #ARGV do
  local name, counts, n = ARGV[i], ARGV[i + 1] == '1', tonumber(ARGV[i + 2])
  local key = prefix .. 'claimed:' .. name
  if not counts then
    redis.call('DEL', key)
  elseif n > 0 then
    redis.call('ZADD', key, unpack(ARGV, i + 3, i + 2 + 2 * n))
  end
  i = i + 3 + 2 * n
end
return 0

-- GRANT: labels from a review group's shared hourly budget (issue 52; docs/concepts/shared-budget.md).
-- A request loop asks before it issues, and issues at most what it was granted, so the hour's
-- requests of the group never exceed its grants, nor the grants the paced budget.
-- KEYS: the group's granted:<hour> counter.
-- ARGV: the paced allowance so far this hour (lifecycle.budget_allowance), labels asked, ttl_ms.
-- Returns the labels granted: min(asked, allowance - granted this hour), at least 0.
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local give = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if give <= 0 then return 0 end
redis.call('INCRBY', KEYS[1], give)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return give

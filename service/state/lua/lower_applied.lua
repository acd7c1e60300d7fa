-- LOWER_APPLIED: lower a partition's applied mark to the offset a classifier's state went back to
-- (`state.offsets.StateRolledBack`; in a Redis Cluster the marks' node may not have gone back with
-- the classifier's), so the next start reads the partition again from there.
-- KEYS: applied.  ARGV: field, next offset.  Returns 1 if lowered.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur ~= false and tonumber(cur) > tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0

-- GLOBAL_COUNT: service-wide counts (invalid records, labels naming no classifier) with the
-- same offset guard as INGEST (compare-and-set).
-- KEYS: offsets:<scope> (service-wide), the counts hash.  ARGV: partition, expected stored
-- offset, new offset, then field/increment pairs.  Returns {applied (1/0), stored offset}.
local stored = redis.call('HGET', KEYS[1], ARGV[1]) or '-1'
if tonumber(stored) ~= tonumber(ARGV[2]) then return {0, stored} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
for i = 4, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
return {1, ARGV[3]}

-- EVALUATE_ROUND: record a completed round's evaluation once.
-- KEYS: c:<t>:meta.  ARGV: round, streak, status.  Returns 1 if recorded, 0 if already evaluated.
local meta = KEYS[1]
if tonumber(redis.call('HGET', meta, 'evaluated_round') or '0') >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', meta, 'evaluated_round', ARGV[1], 'streak', ARGV[2], 'status', ARGV[3])
return 1

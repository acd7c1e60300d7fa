-- EVALUATE_ROUND: record a completed round's evaluation once.
-- KEYS: c:<t>:meta, counters.  ARGV: round, streak, status.  Returns 1 if recorded, 0 if already evaluated.
-- A closed chunk's status that changes is counted in the counters' status_changes (as SET_STATUS).
local meta = KEYS[1]
local old = redis.call('HMGET', meta, 'evaluated_round', 'status', 'status_closed')
if tonumber(old[1] or '0') >= tonumber(ARGV[1]) then return 0 end
if old[2] ~= ARGV[3] and old[3] == '1' then redis.call('HINCRBY', KEYS[2], 'status_changes', 1) end
redis.call('HSET', meta, 'evaluated_round', ARGV[1], 'streak', ARGV[2], 'status', ARGV[3])
return 1

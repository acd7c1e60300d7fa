-- SET_STATUS: the chunk's status as the request loop last saw it (derived state, not guarded), and
-- whether it saw the chunk closed.
-- KEYS: c:<t>:meta, counters.  ARGV: status, closed (0 or 1).  Returns 1 if the status changed, else 0.
-- A status that changes is counted in the counters' status_changes (as EVALUATE_ROUND).
local meta = KEYS[1]
local changed = redis.call('HGET', meta, 'status') ~= ARGV[1]
if changed then redis.call('HINCRBY', KEYS[2], 'status_changes', 1) end
redis.call('HSET', meta, 'status', ARGV[1], 'status_closed', ARGV[2])
if changed then return 1 end
return 0

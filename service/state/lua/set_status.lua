-- SET_STATUS: the chunk's status as the request loop last saw it (derived state, not guarded), and
-- whether it saw the chunk closed.
-- KEYS: c:<t>:meta, counters.  ARGV: status, closed (0 or 1).  Returns 1 if status_changes was counted, else 0.
-- Counted in the counters' status_changes: a closed chunk's status that changes, and the first write
-- that sees the chunk closed (what a scrape remembers of closed chunks is current while that count
-- and the labels folded are, api.closed_chunks; an open chunk's status may move every step).
local meta = KEYS[1]
local old = redis.call('HMGET', meta, 'status', 'status_closed')
local counted = ARGV[2] == '1' and (old[1] ~= ARGV[1] or old[2] ~= '1')
if counted then redis.call('HINCRBY', KEYS[2], 'status_changes', 1) end
redis.call('HSET', meta, 'status', ARGV[1], 'status_closed', ARGV[2])
if counted then return 1 end
return 0

-- EVALUATE_ROUND: record a completed round's evaluation once.
-- KEYS: c:<t>:meta, counters.  ARGV: round, streak, status.  Returns 1 if recorded, 0 if already evaluated.
-- A status that changes is counted in the counters' status_changes (what a scrape remembers of
-- closed chunks is current while that count and the labels folded are, api.closed_chunks).
local meta = KEYS[1]
if tonumber(redis.call('HGET', meta, 'evaluated_round') or '0') >= tonumber(ARGV[1]) then return 0 end
if redis.call('HGET', meta, 'status') ~= ARGV[3] then redis.call('HINCRBY', KEYS[2], 'status_changes', 1) end
redis.call('HSET', meta, 'evaluated_round', ARGV[1], 'streak', ARGV[2], 'status', ARGV[3])
return 1

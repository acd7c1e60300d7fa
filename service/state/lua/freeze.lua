-- FREEZE: a provisional chunk (one stratum, lua/restratify.lua) that closed before 25 x K of its
-- items came keeps its one stratum for good, so that the request loop may sample it: `provisional`
-- is cleared, cuts_version incremented (an INGEST prepared with the provisional cuts is refused as
-- stale and redone on the frozen ones; RESTRATIFY finds it not provisional and does nothing) and the
-- exact scores kept for RESTRATIFY are dropped.
-- KEYS: c:<t>:meta, c:<t>:pscores.  ARGV: none.
-- Returns 1 if it froze the chunk, 0 if the chunk was not provisional (re-stratified meanwhile).
if redis.call('HGET', KEYS[1], 'provisional') ~= '1' then return 0 end
redis.call('HDEL', KEYS[1], 'provisional')
redis.call('HINCRBY', KEYS[1], 'cuts_version', 1)
redis.call('DEL', KEYS[2])
return 1

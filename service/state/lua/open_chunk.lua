-- OPEN_CHUNK: give a chunk its strata boundaries unless it has them; the first caller's cuts win.
-- KEYS: c:<t>:meta.  ARGV: cuts JSON, now_ms, provisional ('1': one stratum until RESTRATIFY),
-- RESERVOIR_SIZE (kept as `res_size`: the chunk's reservoirs never grow past it, see INGEST).
-- Returns the stored {cuts, cuts_version, provisional ('1' or '')}.
local meta = KEYS[1]
if redis.call('HSETNX', meta, 'cuts', ARGV[1]) == 1 then
  redis.call('HSET', meta, 'opened_ms', ARGV[2], 'round', 0, 'evaluated_round', 0, 'streak', 0,
             'status', 'open', 'status_closed', 0, 'cuts_version', 0, 'res_size', ARGV[4])
  if ARGV[3] == '1' then redis.call('HSET', meta, 'provisional', '1') end
end
local f = redis.call('HMGET', meta, 'cuts', 'cuts_version', 'provisional')
return {f[1], f[2] or '0', f[3] or ''}

-- EXPIRE: expire the requests whose deadline has passed; each is replaced in its stratum.
-- KEYS: pending, counters, req:<rid> of every due request (in ZRANGEBYSCORE order), then the
--   c:<t>:replace hashes of their chunks.
-- ARGV: now_ms, then per due request: request id, the chunk read from its hash ('' if none), the
--   index in KEYS of that chunk's replace hash (0 if none).
-- Re-check (the keys come from reads before this call): if the due requests or a pending
-- request's chunk are not what the caller read, nothing changes and -1 is returned (the caller
-- reads again and retries).  Returns the number of due requests.
local pending, cnt = KEYS[1], KEYS[2]
local n = (#ARGV - 1) / 3
local due = redis.call('ZRANGEBYSCORE', pending, '-inf', ARGV[1])
if #due ~= n then return -1 end
local states = {}
for i = 1, n do
  if due[i] ~= ARGV[3 * i - 1] then return -1 end
  local rk = KEYS[2 + i]
  local st = redis.call('HGET', rk, 'state')
  if st == 'new' or st == 'pending' or st == 'joined' then
    if redis.call('HGET', rk, 'chunk') ~= ARGV[3 * i] or tonumber(ARGV[3 * i + 1]) < 1 then return -1 end
  end
  states[i] = st
end
for i = 1, n do
  local rk = KEYS[2 + i]
  local st = states[i]
  if st == 'new' or st == 'pending' or st == 'joined' then
    redis.call('HSET', rk, 'state', 'expired')
    redis.call('HINCRBY', KEYS[tonumber(ARGV[3 * i + 1])], redis.call('HGET', rk, 'stratum'), 1)
    redis.call('HINCRBY', cnt, 'requests_expired', 1)
  end
  redis.call('ZREM', pending, due[i])
end
return n

-- ISSUE: record a round's label requests (the outbox), fenced by the lease.
-- KEYS: lease, pending, counters, hourly, c:<t>:meta, c:<t>:sampled, c:<t>:replace, joins, then
--   req:<rid> of every request, in the order of the requests JSON.
-- ARGV: chunk, now_ms, deadline_ms, hour, round, fence, requests JSON
-- [[rid, stratum, item_id, score (a string: repr of the float), member[, joined rid]], ...], replaced JSON {stratum: used}, retention_ms
-- (a request is kept that long after its deadline, to recognise duplicate answers), and
-- optionally the chunk's inclusion thresholds JSON (stats.streams) the requests were drawn under.
-- A request with a joined rid (a review group that shares items, `requests.shared_items`) is
-- recorded `joined`: it is never published, costs the hour's budget nothing (requests_joined, not
-- requests_total), and waits in `joins` for the answer of the request it joined.
-- Returns {-1} if the caller does not hold the lease, else the request ids issued (an item
-- already requested in this chunk is not requested again).
local lease, pending, cnt, hourly = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local cmeta, sampled, replace, joins = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
if redis.call('GET', lease) ~= ARGV[6] then return {-1} end
local reqs = cjson.decode(ARGV[7])
if #KEYS ~= 8 + #reqs then return redis.error_reply('ISSUE: one request key per request') end
local issued, published, joined = {}, 0, 0
for i, r in ipairs(reqs) do
  if redis.call('SADD', sampled, r[3]) == 1 then
    local rk = KEYS[8 + i]
    local joining = r[6] and r[6] ~= ''
    redis.call('HSET', rk, 'chunk', ARGV[1], 'stratum', r[2], 'item', r[5], 'score', r[4], 'deadline_ms', ARGV[3],
               'requested_ms', ARGV[2], 'round', ARGV[5], 'state', joining and 'joined' or 'new')
    if joining then
      redis.call('HSET', rk, 'joins', r[6])
      redis.call('HSET', joins, r[1], r[6])
      joined = joined + 1
    else
      published = published + 1
    end
    redis.call('PEXPIREAT', rk, tonumber(ARGV[3]) + tonumber(ARGV[9]))
    redis.call('ZADD', pending, ARGV[3], r[1])
    issued[#issued + 1] = r[1]
  end
end
redis.call('HINCRBY', cnt, 'requests_total', published)
if joined > 0 then redis.call('HINCRBY', cnt, 'requests_joined', joined) end
redis.call('HINCRBY', hourly, ARGV[4], published)
redis.call('HSET', cmeta, 'round', ARGV[5])
if ARGV[10] then redis.call('HSET', cmeta, 'tau', ARGV[10]) end
for k, used in pairs(cjson.decode(ARGV[8])) do
  local left = tonumber(redis.call('HGET', replace, k) or '0') - used
  if left > 0 then redis.call('HSET', replace, k, left) else redis.call('HDEL', replace, k) end
end
return issued

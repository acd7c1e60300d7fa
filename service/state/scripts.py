"""Lua scripts: every state change is one atomic script on one classifier's slot.

Exactly-once without Kafka transactions: each script that applies records
from a topic partition first compares the partition's last applied offset,
stored with the classifier's state, and applies and advances it in the same
atomic call.  A batch replayed after a crash is recognised and skipped (or,
for the scores topic, re-aggregated from the stored offset), so consumer
offsets may be committed after the fact with at-least-once delivery and the
state still changes exactly once.  Key stems are passed in KEYS[1]; the keys a
script builds from it share the stem's hash tag, so each script stays within
one Redis Cluster slot.
"""

# Returns {applied (1/0), stored offset, then for every reservoir this call touched that is
# full: chunk, stratum, the largest priority kept (a string, exact)}.  A full reservoir's
# largest priority only ever decreases, so the ingestor may drop later candidates above it.
# Cuts guard (like the offset guard, nothing is applied when it refuses): every chunk of the
# payload carries the cuts version `v` it was aggregated with; a provisional chunk's also
# `cap`, `n` (its predicted positives in the payload) and `ps` (score -> count).  Refused:
# {0, stored offset, then per refused chunk: chunk, 1 (stale cuts: reload them) or 2 (the
# provisional chunk would reach `cap` items: RESTRATIFY it first)}.
INGEST = r"""
local stem = KEYS[1]
local okey = stem .. ':offsets:scores'
local stored = redis.call('HGET', okey, ARGV[1]) or '-1'
if tonumber(stored) ~= tonumber(ARGV[2]) then return {0, stored} end
local p = cjson.decode(ARGV[4])
local refused, prov = {0, stored}, {}
for _, c in ipairs(p.chunks) do
  local f = redis.call('HMGET', stem .. ':c:' .. c.t .. ':meta', 'cuts_version', 'provisional')
  if tonumber(f[1] or '0') ~= (c.v or 0) then
    refused[#refused + 1] = c.t
    refused[#refused + 1] = 1
  elseif f[2] == '1' then
    prov[c.t] = true
    if not c.cap or tonumber(redis.call('HGET', stem .. ':c:' .. c.t .. ':N', '0') or '0') + c.n >= c.cap then
      refused[#refused + 1] = c.t
      refused[#refused + 1] = 2
    end
  end
end
if #refused > 2 then return refused end
redis.call('HSET', okey, ARGV[1], ARGV[3])
local out = {1, ARGV[3]}
local meta = stem .. ':meta'
redis.call('HINCRBY', meta, 'scores_total', p.scores)
redis.call('HSETNX', meta, 'first_seen_ms', p.now)
local le = tonumber(redis.call('HGET', meta, 'last_event_ms') or '-1')
if p.last_event > le then redis.call('HSET', meta, 'last_event_ms', p.last_event) end
for _, c in ipairs(p.chunks) do
  local ck = stem .. ':c:' .. c.t
  redis.call('ZADD', stem .. ':chunks', c.t, c.t)
  if #c.N > 0 then  -- wall-clock arrival span of the chunk (the stream forecast, stats.streams)
    redis.call('HSETNX', ck .. ':meta', 'first_ms', p.now)
    if tonumber(redis.call('HGET', ck .. ':meta', 'last_ms') or '-1') < p.now then
      redis.call('HSET', ck .. ':meta', 'last_ms', p.now)
    end
  end
  for i = 1, #c.hist, 2 do redis.call('HINCRBY', ck .. ':hist', c.hist[i], c.hist[i + 1]) end
  for i = 1, #c.N, 2 do redis.call('HINCRBY', ck .. ':N', c.N[i], c.N[i + 1]) end
  if prov[c.t] and c.ps then  -- exact scores of a provisional chunk, for RESTRATIFY
    for i = 1, #c.ps, 2 do redis.call('HINCRBY', ck .. ':pscores', c.ps[i], c.ps[i + 1]) end
  end
  if c.lo then
    local lo = tonumber(redis.call('HGET', ck .. ':meta', 'min') or '1e308')
    local hi = tonumber(redis.call('HGET', ck .. ':meta', 'max') or '-1e308')
    if c.lo < lo then redis.call('HSET', ck .. ':meta', 'min', c.lo_s) end
    if c.hi > hi then redis.call('HSET', ck .. ':meta', 'max', c.hi_s) end
  end
  for _, r in ipairs(c.res) do
    local rk = ck .. ':res:' .. r[1]
    local args = r[2]
    for i = 1, #args, 400 do
      redis.call('ZADD', rk, unpack(args, i, math.min(i + 399, #args)))
    end
    redis.call('ZREMRANGEBYRANK', rk, p.res_size, -1)
    if redis.call('ZCARD', rk) >= p.res_size then
      local last = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
      out[#out + 1] = c.t
      out[#out + 1] = r[1]
      out[#out + 1] = last[2]
    end
  end
end
return out
"""

# ARGV: chunk, cuts JSON, now_ms, provisional ('1': one stratum until RESTRATIFY).  The first
# caller's cuts win.  Returns the stored {cuts, cuts_version, provisional ('1' or '')}.
OPEN_CHUNK = r"""
local meta = KEYS[1] .. ':c:' .. ARGV[1] .. ':meta'
if redis.call('HSETNX', meta, 'cuts', ARGV[2]) == 1 then
  redis.call('HSET', meta, 'opened_ms', ARGV[3], 'round', 0, 'evaluated_round', 0, 'streak', 0,
             'status', 'open', 'cuts_version', 0)
  if ARGV[4] == '1' then redis.call('HSET', meta, 'provisional', '1') end
end
local f = redis.call('HMGET', meta, 'cuts', 'cuts_version', 'provisional')
return {f[1], f[2] or '0', f[3] or ''}
"""

# Re-stratify a provisional chunk (opened with one stratum, every item in reservoir 0, exact
# scores in `pscores`) with its final cuts, atomically.  KEYS: the chunk's meta, N, pscores,
# then res:0 .. res:K-1 (K = #cuts + 1; every key touched is declared, one slot: {cid}).
# ARGV: expected cuts_version, cuts JSON (increasing).  Stratum of a score s: the number of
# cuts <= s (stats.strata.assign).  N is recomputed from the exact scores, every reservoir
# member moves to its stratum with its priority; `provisional` is cleared and cuts_version
# incremented.  A chunk whose exact scores no longer add up to N (purged by retention) is
# frozen with its one stratum instead.  Returns {1 (done) or 0 (not provisional or another
# version: reload), the stored cuts_version}.
RESTRATIFY = r"""
local meta, nkey, pkey = KEYS[1], KEYS[2], KEYS[3]
local f = redis.call('HMGET', meta, 'cuts_version', 'provisional')
local v = tonumber(f[1] or '0')
if f[2] ~= '1' or v ~= tonumber(ARGV[1]) then return {0, v} end
local cuts = cjson.decode(ARGV[2])
if #KEYS ~= 3 + #cuts + 1 then return redis.error_reply('RESTRATIFY: one reservoir key per stratum') end
local function stratum(s)
  local k = 0
  for i = 1, #cuts do
    if cuts[i] <= s then k = i else break end
  end
  return k
end
local ps = redis.call('HGETALL', pkey)
local total = 0
for i = 2, #ps, 2 do total = total + tonumber(ps[i]) end
local nall = redis.call('HGETALL', nkey)
local n0 = 0
for i = 1, #nall, 2 do n0 = n0 + tonumber(nall[i + 1]) end
redis.call('DEL', pkey)
redis.call('HDEL', meta, 'provisional')
redis.call('HSET', meta, 'cuts_version', v + 1)
if total ~= n0 then return {1, v + 1} end  -- state purged meanwhile: keep the one stratum
local counts = {}
for i = 1, #ps, 2 do
  local k = stratum(tonumber(ps[i]))
  counts[k] = (counts[k] or 0) + tonumber(ps[i + 1])
end
local mem = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
redis.call('DEL', KEYS[4])
local groups = {}
for i = 1, #mem, 2 do
  -- members are orjson {"i": id, "s": score, "x": context}: the first ',"s":' is the score's
  local s = tonumber(string.match(mem[i], ',"s":([^,}]+)') or '') or cjson.decode(mem[i]).s
  local k = stratum(s)
  local g = groups[k]
  if not g then g = {}; groups[k] = g end
  g[#g + 1] = mem[i + 1]
  g[#g + 1] = mem[i]
end
for k, g in pairs(groups) do
  for i = 1, #g, 400 do redis.call('ZADD', KEYS[4 + k], unpack(g, i, math.min(i + 399, #g))) end
end
redis.call('DEL', nkey)
for k, c in pairs(counts) do redis.call('HSET', nkey, k, c) end
redis.call('HSET', meta, 'cuts', ARGV[2])
return {1, v + 1}
"""

LABEL = r"""
local stem = KEYS[1]
local okey = stem .. ':offsets:labels'
local stored = tonumber(redis.call('HGET', okey, ARGV[1]) or '-1')
if tonumber(ARGV[2]) <= stored then return {'replay'} end
redis.call('HSET', okey, ARGV[1], ARGV[2])
local cnt = stem .. ':counters'
local rk = stem .. ':req:' .. ARGV[3]
local st = redis.call('HGET', rk, 'state')
if not st then
  redis.call('HINCRBY', cnt, 'labels_unknown', 1)
  return {'unknown'}
end
if st == 'answered' or st == 'skipped' then
  redis.call('HINCRBY', cnt, 'labels_duplicate', 1)
  return {'duplicate'}
end
if st == 'expired' then
  redis.call('HINCRBY', cnt, 'labels_expired', 1)
  return {'expired'}
end
local chunk = redis.call('HGET', rk, 'chunk')
local k = redis.call('HGET', rk, 'stratum')
redis.call('ZREM', stem .. ':pending', ARGV[3])
if ARGV[4] == 'null' then
  redis.call('HSET', rk, 'state', 'skipped', 'answered_ms', ARGV[5])
  redis.call('HINCRBY', cnt, 'labels_skipped', 1)
  redis.call('HINCRBY', stem .. ':c:' .. chunk .. ':replace', k, 1)
  return {'skipped', chunk, k}
end
redis.call('HSET', rk, 'state', 'answered', 'label', ARGV[4], 'answered_ms', ARGV[5], 'labeler', ARGV[6])
redis.call('HINCRBY', stem .. ':c:' .. chunk .. ':n', k, 1)
redis.call('HINCRBY', stem .. ':c:' .. chunk .. ':h', k, tonumber(ARGV[4]))
redis.call('HINCRBY', cnt, 'labels_accepted', 1)
redis.call('HSET', cnt, 'last_label_ms', ARGV[5])
return {'accepted', chunk, k}
"""

EXPIRE = r"""
local stem = KEYS[1]
local due = redis.call('ZRANGEBYSCORE', stem .. ':pending', '-inf', ARGV[1])
local cnt = stem .. ':counters'
for _, rid in ipairs(due) do
  local rk = stem .. ':req:' .. rid
  local st = redis.call('HGET', rk, 'state')
  if st == 'new' or st == 'pending' then
    redis.call('HSET', rk, 'state', 'expired')
    redis.call('HINCRBY', stem .. ':c:' .. redis.call('HGET', rk, 'chunk') .. ':replace',
               redis.call('HGET', rk, 'stratum'), 1)
    redis.call('HINCRBY', cnt, 'requests_expired', 1)
  end
  redis.call('ZREM', stem .. ':pending', rid)
end
return #due
"""

# ARGV: chunk, now_ms, deadline_ms, hour, round, fence, requests JSON
# [[rid, stratum, item_id, score, member], ...], replaced JSON {stratum: used}, retention_ms
# (a request is kept that long after its deadline, to recognise duplicate answers), and
# optionally the chunk's inclusion thresholds JSON (stats.streams) the requests were drawn under
ISSUE = r"""
local stem = KEYS[1]
if redis.call('GET', stem .. ':lease') ~= ARGV[6] then return {-1} end
local ck = stem .. ':c:' .. ARGV[1]
local reqs = cjson.decode(ARGV[7])
local issued = {}
for _, r in ipairs(reqs) do
  if redis.call('SADD', ck .. ':sampled', r[3]) == 1 then
    local rk = stem .. ':req:' .. r[1]
    redis.call('HSET', rk, 'chunk', ARGV[1], 'stratum', r[2], 'item', r[5], 'deadline_ms', ARGV[3],
               'requested_ms', ARGV[2], 'round', ARGV[5], 'state', 'new')
    redis.call('PEXPIREAT', rk, tonumber(ARGV[3]) + tonumber(ARGV[9]))
    redis.call('ZADD', stem .. ':pending', ARGV[3], r[1])
    issued[#issued + 1] = r[1]
  end
end
redis.call('HINCRBY', stem .. ':counters', 'requests_total', #issued)
redis.call('HINCRBY', stem .. ':hourly', ARGV[4], #issued)
redis.call('HSET', ck .. ':meta', 'round', ARGV[5])
if ARGV[10] then redis.call('HSET', ck .. ':meta', 'tau', ARGV[10]) end
for k, used in pairs(cjson.decode(ARGV[8])) do
  local left = tonumber(redis.call('HGET', ck .. ':replace', k) or '0') - used
  if left > 0 then redis.call('HSET', ck .. ':replace', k, left) else redis.call('HDEL', ck .. ':replace', k) end
end
return issued
"""

MARK_PUBLISHED = r"""
for i, rid in ipairs(ARGV) do
  local rk = KEYS[1] .. ':req:' .. rid
  if redis.call('HGET', rk, 'state') == 'new' then redis.call('HSET', rk, 'state', 'pending') end
end
return #ARGV
"""

# Evaluate a completed round once: ARGV round, streak, status
EVALUATE_ROUND = r"""
local meta = KEYS[1] .. ':c:' .. ARGV[1] .. ':meta'
if tonumber(redis.call('HGET', meta, 'evaluated_round') or '0') >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', meta, 'evaluated_round', ARGV[2], 'streak', ARGV[3], 'status', ARGV[4])
return 1
"""

# Lease with fencing: ARGV instance, ttl_ms.  Returns 1 if held by the caller.
LEASE = r"""
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

RELEASE = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Global counters (invalid records) with the same offset guard: ARGV partition, expected,
# new, then field/increment pairs.
GLOBAL_COUNT = r"""
local stored = redis.call('HGET', KEYS[1], ARGV[1]) or '-1'
if tonumber(stored) ~= tonumber(ARGV[2]) then return {0, stored} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
for i = 4, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
return {1, ARGV[3]}
"""

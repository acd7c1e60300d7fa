-- RESTRATIFY: re-stratify a provisional chunk (opened with one stratum, every item in reservoir
-- 0, exact scores in `pscores`) with its final cuts, atomically.
-- KEYS: c:<t>:meta, c:<t>:N, c:<t>:pscores, then c:<t>:res:0 .. c:<t>:res:<K-1> (K = #cuts + 1).
-- ARGV: expected cuts_version, cuts JSON (increasing).  Stratum of a score s: the number of
-- cuts <= s (stats.strata.assign).  N is recomputed from the exact scores, every reservoir
-- member moves to its stratum with its priority; `provisional` is cleared and cuts_version
-- incremented.  A chunk whose exact scores no longer add up to N (purged by retention) is
-- frozen with its one stratum instead.  Returns {1 (done) or 0 (not provisional or another
-- version: reload), the stored cuts_version}.
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

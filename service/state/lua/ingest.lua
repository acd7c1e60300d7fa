-- INGEST: apply one classifier's aggregated score batch from one scores partition.
-- KEYS: offsets:scores, meta, chunks, then for every chunk of the payload, in its order:
--   c:<t>:meta, c:<t>:bins, c:<t>:N, c:<t>:pscores, and c:<t>:res:<k> for each entry of its `res`.
-- ARGV: partition, expected stored offset, new offset, payload (ingest.aggregate.build_payload as
-- msgpack, state.scripts.encode_ingest), blob (the bytes its `runs` locate).  A chunk's histogram
-- change (ingest.bins) is either `hist`, flat ["INCRBY", "u32", "#bucket", count, ...]: BITFIELD's
-- arguments on c:<t>:bins, or `runs`, flat [byte offset, at, length, ...]: at that offset of
-- c:<t>:bins the `length` bytes at `at` of the blob must be found and the next `length` are written.
-- Offset guard (compare-and-set): nothing is applied unless the partition's stored offset is the
-- expected one; then the state changes and the offset advances in this one call.
-- A reservoir keeps its `size` lowest priorities and, beyond them, every member at or below its
-- stratum's threshold (`tau` in c:<t>:meta, stored by ISSUE), up to `sample_cap` x the chunk's
-- opening size (ingest.aggregate.SAMPLE_CAP).  `size` is the payload's `res_size` (RESERVOIR_SIZE),
-- but never more than the chunk opened with (`res_size` in c:<t>:meta, OPEN_CHUNK): items a
-- smaller size dropped earlier cannot come back, so a raised size waits for the next chunk.
-- Returns {applied (1/0), stored offset, then for every reservoir this call touched that is
-- full: chunk, stratum, the cutoff (a string, exact): the larger of the largest priority kept
-- and the threshold}.  A candidate above it can never enter, and the cutoff only ever
-- decreases (the loop never raises a full reservoir's threshold past its largest priority),
-- so the ingestor may drop later candidates above it.
-- Chunk guards (like the offset guard, nothing is applied when one refuses): every chunk of the
-- payload carries the cuts version `v` it was aggregated with; a provisional chunk's also
-- `cap`, `n` (its predicted positives in the payload) and `ps` (score -> count).  Refused:
-- {0, stored offset, then per refused chunk: chunk, reason}, the reason one of
-- (state.calls.IngestRefusal):
--   1 IngestRefusal.STALE_CUTS        stale cuts, or none: reload them;
--   2 IngestRefusal.RESTRATIFY_FIRST  the provisional chunk would reach `cap` items: RESTRATIFY it first;
--   3 IngestRefusal.BINS_CHANGED      its histogram's counters under `runs` are not the old bytes: read
--                                     them again.
local okey, meta, chunks = KEYS[1], KEYS[2], KEYS[3]
local stored = redis.call('HGET', okey, ARGV[1]) or '-1'
if tonumber(stored) ~= tonumber(ARGV[2]) then return {0, stored} end
local p = cmsgpack.unpack(ARGV[4])
local SAMPLE_CAP = p.sample_cap or 1
local base, at = {}, 4  -- base[i]: the index in KEYS of chunk i's meta
for i, c in ipairs(p.chunks) do
  base[i] = at
  at = at + 4 + #c.res
end
if at ~= #KEYS + 1 then return redis.error_reply('INGEST: KEYS do not match the payload') end
local blob = ARGV[5] or ''
local function runs_unchanged(bins, runs)  -- a counter past the string's end reads as zero
  for j = 1, #runs, 3 do
    local offset, at, n = runs[j], runs[j + 1], runs[j + 2]
    local cur, old = redis.call('GETRANGE', bins, offset, offset + n - 1), string.sub(blob, at, at + n - 1)
    if cur ~= string.sub(old, 1, #cur) or string.find(old, '[^%z]', #cur + 1) then return false end
  end
  return true
end
local refused, prov, opened = {0, stored}, {}, {}
for i, c in ipairs(p.chunks) do
  local f = redis.call('HMGET', KEYS[base[i]], 'cuts_version', 'provisional', 'res_size', 'cuts')
  if not f[4] or tonumber(f[1] or '0') ~= (c.v or 0) then  -- no cuts: the chunk is gone (Redis lost it)
    refused[#refused + 1] = c.t
    refused[#refused + 1] = 1  -- IngestRefusal.STALE_CUTS
  elseif f[2] == '1' and (not c.cap or tonumber(redis.call('HGET', KEYS[base[i] + 2], '0') or '0') + c.n >= c.cap) then
    refused[#refused + 1] = c.t
    refused[#refused + 1] = 2  -- IngestRefusal.RESTRATIFY_FIRST
  elseif c.runs and not runs_unchanged(KEYS[base[i] + 1], c.runs) then
    refused[#refused + 1] = c.t
    refused[#refused + 1] = 3  -- IngestRefusal.BINS_CHANGED
  end
  prov[i] = f[2] == '1'
  opened[i] = tonumber(f[3]) or p.res_size  -- absent: a chunk opened before the field
end
if #refused > 2 then return refused end
redis.call('HSET', okey, ARGV[1], ARGV[3])
local out = {1, ARGV[3]}
-- `unpaired` (the classifier's own state, when its metrics need no predicted negatives): these
-- records never go to its negatives' state, whose chunks up to the latest event time among them
-- (`unpaired_through_ms`) therefore miss records (a metric that needs them enabled mid-chunk)
if p.unpaired and p.last_event > tonumber(redis.call('HGET', meta, 'unpaired_through_ms') or '-1') then
  redis.call('HSET', meta, 'unpaired_through_ms', p.last_event)
end
redis.call('HINCRBY', meta, 'scores_total', p.scores)
redis.call('HSETNX', meta, 'first_seen_ms', p.now)
local le = tonumber(redis.call('HGET', meta, 'last_event_ms') or '-1')
if p.last_event > le then redis.call('HSET', meta, 'last_event_ms', p.last_event) end
for i, c in ipairs(p.chunks) do
  local b = base[i]
  local cmeta, bins, nkey, pkey = KEYS[b], KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  redis.call('ZADD', chunks, c.t, c.t)
  if #c.N > 0 then  -- wall-clock arrival span of the chunk (the stream forecast, stats.streams)
    redis.call('HSETNX', cmeta, 'first_ms', p.now)
    if tonumber(redis.call('HGET', cmeta, 'last_ms') or '-1') < p.now then
      redis.call('HSET', cmeta, 'last_ms', p.now)
    end
  end
  -- the histogram: increments, one BITFIELD per 1000 buckets (measured: a HINCRBY per bucket cost a
  -- third of this script's time with predicted negatives; LUAI_MAXCSTACK bounds what `unpack` may
  -- spread), or the runs' new bytes, checked above (ingest.bins: cheaper still)
  for a = 1, #(c.hist or {}), 4000 do
    redis.call('BITFIELD', bins, 'OVERFLOW', 'SAT', unpack(c.hist, a, math.min(a + 3999, #c.hist)))
  end
  -- the highest run first, so a string grows once: Redis gives a growing string twice its length
  for j = #(c.runs or {}) - 2, 1, -3 do
    local offset, at, n = c.runs[j], c.runs[j + 1], c.runs[j + 2]
    redis.call('SETRANGE', bins, offset, string.sub(blob, at + n, at + 2 * n - 1))
  end
  for j = 1, #c.N, 2 do redis.call('HINCRBY', nkey, c.N[j], c.N[j + 1]) end
  if prov[i] and c.ps then  -- exact scores of a provisional chunk, for RESTRATIFY
    for j = 1, #c.ps, 2 do redis.call('HINCRBY', pkey, c.ps[j], c.ps[j + 1]) end
  end
  if c.lo then
    local lo = tonumber(redis.call('HGET', cmeta, 'min') or '1e308')
    local hi = tonumber(redis.call('HGET', cmeta, 'max') or '-1e308')
    if c.lo < lo then redis.call('HSET', cmeta, 'min', c.lo_s) end
    if c.hi > hi then redis.call('HSET', cmeta, 'max', c.hi_s) end
  end
  local tau = redis.call('HGET', cmeta, 'tau')  -- the strata's inclusion thresholds (ISSUE), if any
  tau = tau and cjson.decode(tau) or {}
  for j, r in ipairs(c.res) do
    local rk = KEYS[b + 3 + j]
    local args = r[2]
    for a = 1, #args, 400 do
      redis.call('ZADD', rk, unpack(args, a, math.min(a + 399, #args)))
    end
    -- bottom-k, plus every member at or below the stratum's threshold (the sample: a threshold
    -- set before the reservoir filled must keep admitting what arrives under it), at most
    -- SAMPLE_CAP x the opening size (a size lowered since never cuts into the sample)
    local th = tonumber(tau[r[1] + 1] or 0)
    local size, cap = math.min(opened[i], p.res_size), SAMPLE_CAP * opened[i]
    local keep = size
    if th > 0 then
      local under = redis.call('ZCOUNT', rk, '-inf', string.format('%.17g', th))
      keep = math.min(math.max(keep, under), cap)
    end
    redis.call('ZREMRANGEBYRANK', rk, keep, -1)
    if redis.call('ZCARD', rk) >= size then
      local last = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
      local cutoff = last[2]
      if th > tonumber(cutoff) and keep < cap then cutoff = string.format('%.17g', th) end
      out[#out + 1] = c.t
      out[#out + 1] = r[1]
      out[#out + 1] = cutoff
    end
  end
end
return out

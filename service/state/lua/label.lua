-- LABEL: fold one label record into its request's chunk, exactly once.
-- KEYS: offsets:labels, counters, pending, req:<rid>, meta, and, when the caller found the
--   request's chunk <t> in req:<rid>: c:<t>:replace, c:<t>:n, c:<t>:h, c:<t>:labelled.
-- ARGV: partition, offset, request id, label ('1', '0' or 'null': skipped), now_ms, labeler,
--   the chunk the caller read from req:<rid> ('' if none), the offset of the previous call for
--   this classifier and partition in the same pipeline ('' if none), the offset the caller last saw
--   applied for them ('' if none).
-- Offset guard: an offset at or below the partition's stored one is a replay and changes nothing.
-- A stored offset below the one the caller saw applied (Redis lost acknowledged writes:
-- `state.offsets.StateRolledBack`) refuses ({'rolled_back', stored}, nothing changed).
-- Re-check (the chunk keys come from a read before this call): a request that still awaits its
-- answer but names another chunk than the one read refuses ({'retry'}, nothing changed; the
-- caller reads again and retries).  So that a retried label cannot fall behind a later offset
-- of its partition, a call whose predecessor in the pipeline was refused refuses too.
-- A state that does not exist (no meta: the request id's classifier part was made up) is left
-- untouched ({'no_state'}): the caller counts the label service-wide, so an outsider's made-up
-- ids create no key.
-- Deadline: an answer to a request whose deadline (deadline_ms) is at or before now_ms is
-- `expired` even when EXPIRE has not swept the request yet (the request loop runs it about once
-- a tick): this call then expires the request as EXPIRE would (replaced in its stratum).
-- A joined request (`requests.shared_items`) takes the answer of the request it joined with the
-- partition '' (ARGV[1]): no offset guard, the request's own state is the guard; a request that
-- is no longer `joined` changes nothing ({'resolved'}).
-- Returns {outcome[, chunk, stratum]}: replay (with the stored offset), rolled_back (with it), retry,
-- no_state, unknown, duplicate, expired, skipped, accepted, resolved.
local okey, cnt, pending, rk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local joined = ARGV[1] == ''
if not joined then
  local stored = tonumber(redis.call('HGET', okey, ARGV[1]) or '-1')
  if tonumber(ARGV[2]) <= stored then return {'replay', tostring(stored)} end
  if ARGV[9] ~= '' and stored >= 0 and stored < tonumber(ARGV[9]) then return {'rolled_back', tostring(stored)} end
  if ARGV[8] ~= '' and stored < tonumber(ARGV[8]) then return {'retry'} end
end
local st = redis.call('HGET', rk, 'state')
local chunk = redis.call('HGET', rk, 'chunk')
if (st == 'new' or st == 'pending' or st == 'joined') and (chunk ~= ARGV[7] or #KEYS < 8) then return {'retry'} end
if joined and st ~= 'joined' then return {'resolved'} end
if not st and redis.call('EXISTS', KEYS[5]) == 0 then return {'no_state'} end
if not joined then redis.call('HSET', okey, ARGV[1], ARGV[2]) end
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
local replace, nkey, hkey = KEYS[6], KEYS[7], KEYS[8]
local k = redis.call('HGET', rk, 'stratum')
redis.call('ZREM', pending, ARGV[3])
local deadline = redis.call('HGET', rk, 'deadline_ms')
if deadline and tonumber(deadline) <= tonumber(ARGV[5]) then  -- what EXPIRE does, then the answer is late
  redis.call('HSET', rk, 'state', 'expired')
  redis.call('HINCRBY', replace, k, 1)
  redis.call('HINCRBY', cnt, 'requests_expired', 1)
  redis.call('HINCRBY', cnt, 'labels_expired', 1)
  return {'expired', chunk, k}
end
if ARGV[4] == 'null' then
  redis.call('HSET', rk, 'state', 'skipped', 'answered_ms', ARGV[5])
  redis.call('HINCRBY', cnt, 'labels_skipped', 1)
  redis.call('HINCRBY', replace, k, 1)
  return {'skipped', chunk, k}
end
redis.call('HSET', rk, 'state', 'answered', 'label', ARGV[4], 'answered_ms', ARGV[5], 'labeler', ARGV[6])
redis.call('HINCRBY', nkey, k, 1)
redis.call('HINCRBY', hkey, k, tonumber(ARGV[4]))
if KEYS[9] then  -- the labelled item, for the difference estimator (requests issued before `score`: from the item)
  local score = redis.call('HGET', rk, 'score') or tostring(cjson.decode(redis.call('HGET', rk, 'item')).s)
  redis.call('HSET', KEYS[9], ARGV[3], table.concat({k, ARGV[4], score}, ' '))
end
redis.call('HINCRBY', cnt, 'labels_accepted', 1)
if joined then redis.call('HINCRBY', cnt, 'labels_shared', 1) end
redis.call('HSET', cnt, 'last_label_ms', ARGV[5])
return {'accepted', chunk, k}

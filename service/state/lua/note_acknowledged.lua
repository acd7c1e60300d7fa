-- NOTE_ACKNOWLEDGED: raise the service-wide copy of the offsets states' guards acknowledged
-- applied (`state.offsets.Acknowledged`, at each commit: `app.checkpoint`), never lower it.
-- KEYS: acknowledged:<sid>, one a state.  ARGV: per key in its order, the count n of its fields,
-- then n (field, offset) pairs.  Returns the number of fields raised.
local raised, at = 0, 1
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  for j = at + 1, at + 2 * n, 2 do
    local cur = redis.call('HGET', key, ARGV[j])
    if not cur or tonumber(cur) < tonumber(ARGV[j + 1]) then
      redis.call('HSET', key, ARGV[j], ARGV[j + 1])
      raised = raised + 1
    end
  end
  at = at + 1 + 2 * n
end
return raised

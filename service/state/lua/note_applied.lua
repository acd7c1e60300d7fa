-- NOTE_APPLIED: raise each partition's applied mark, never lower it (`app.checkpoint`: written
-- after the state changes of the offsets below it, before they are committed to Kafka).
-- KEYS: applied.  ARGV: field, the mark the caller noted last (-1: none), next offset, ...
-- A mark below the caller's last one (Redis lost acknowledged writes: rolled back) is left as it
-- is; a field with none (the state lost entirely, `app.state_watch`) is noted afresh.
-- Returns each field's mark before the call (false where there was none).
local before = {}
for i = 1, #ARGV, 3 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  before[#before + 1] = cur
  local mark = cur and tonumber(cur) or nil
  if mark == nil or (mark >= tonumber(ARGV[i + 1]) and mark < tonumber(ARGV[i + 2])) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  end
end
return before

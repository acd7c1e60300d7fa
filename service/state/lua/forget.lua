-- FORGET: delete every key of a state that has sent nothing for its whole retained history.
-- KEYS: chunks, then every other key of the state (`keys.Keys.forget_keys`).
-- ARGV: the newest chunk id the caller saw ('' when the state had no chunk).
-- A newer chunk than the caller saw (a score arrived meanwhile) refuses: nothing is deleted.
-- Request records (req:<rid>) are not in KEYS: they expire on their own (PEXPIREAT at issue).
-- Returns 1 if the state was deleted, 0 if refused.
local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0)[1] or ''
if newest ~= ARGV[1] then return 0 end
for _, key in ipairs(KEYS) do
  redis.call('DEL', key)
end
return 1

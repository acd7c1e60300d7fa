-- LEASE: take or keep a lease with fencing.  KEYS: lease.  ARGV: instance, ttl_ms.
-- Returns 1 if held by the caller.
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0

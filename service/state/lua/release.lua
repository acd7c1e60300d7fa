-- RELEASE: give a lease back if the caller holds it.  KEYS: lease.  ARGV: instance.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0

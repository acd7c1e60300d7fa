-- MARK_PUBLISHED: the outbox's last step, once the requests are on the label-request topic.
-- KEYS: req:<rid> of every published request.  A request still `new` becomes `pending`.
-- Returns the number of keys.
for _, rk in ipairs(KEYS) do
  if redis.call('HGET', rk, 'state') == 'new' then redis.call('HSET', rk, 'state', 'pending') end
end
return #KEYS

-- CLAIM: the first request of each item the members of a review group that shares items want
-- (issue 52, `requests.shared_items`); the group's slot.
-- KEYS: the group's item:<item_id> key of every item, in the order of the claims in ARGV.
-- ARGV: the claiming state's request-id prefix ('<state id>/'), the claim's expiry (epoch ms: the deadline of the requests it
--   would issue), then per item 'c' or 'j' followed by the request id it would issue: 'c' may
--   become the item's first request, 'j' may only join one.
-- An item whose key holds a request of another state is joined: its reply entry is that request's
-- id.  Otherwise a 'c' claim sets the key to its request id, expiring at the deadline (the state's
-- own earlier claim is replaced: a request it never issued, or one of an older chunk), and its
-- entry is ''; a 'j' claim changes nothing and its entry is '-'.
local prefix = ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  local first = redis.call('GET', key)
  local mode, rid = string.sub(ARGV[2 + i], 1, 1), string.sub(ARGV[2 + i], 2)
  if first and string.sub(first, 1, #prefix) ~= prefix then
    out[i] = first
  elseif mode == 'c' then
    redis.call('SET', key, rid, 'PXAT', ARGV[2])
    out[i] = ''
  else
    out[i] = '-'
  end
end
return out

-- take = record.lua .. outbox.lua .. this.
-- ARGV[2]: lease_ms; [3]: limit (>= 1); [4]: only this unit's head, or '' for any.
-- Reply: the leased entries (distinct chats; lowest priority, then oldest head first).
local lease, limit, only = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
cleanup(100)
for _, okey in ipairs(redis.call('ZRANGEBYSCORE', K_WAIT, '-inf', fmt(now))) do
  place(okey)
end
local out = {}

-- Lease chat okey's head if it is takeable now: token + 1, attempts + 1.
local function lease_head(okey)
  local head = redis.call('ZRANGE', kkey(okey), 0, 0)
  if not head[1] then
    return nil
  end
  local e = load(head[1], true)
  if e == nil or (e.status ~= 'pending' and e.status ~= 'in_flight') or due_at(e) > now then
    return nil
  end
  if e.status == 'pending' then
    restatus(e, 'in_flight')
  end
  e.att = e.att + 1
  e.tok = e.tok + 1
  e.lease = now + lease
  redis.call('HSET', ekey(e.key), 'status', 'in_flight', 'att', fmt(e.att), 'tok', fmt(e.tok),
             'lease', fmt(e.lease))
  place(okey)
  return e
end

if only ~= '' then
  local e = lease_head(only)
  if e then
    out[1] = reply(e)
  else
    place(only)
  end
  return out
end
while #out < limit do
  local first = redis.call('ZRANGE', K_PRIOS, 0, 0)
  if not first[1] then
    break
  end
  local okey = redis.call('ZRANGE', rkey(first[1]), 0, 0)[1]
  if not okey then
    redis.call('ZREM', K_PRIOS, first[1])
  else
    local e = lease_head(okey)
    if e then
      out[#out + 1] = reply(e)
    else
      -- not takeable after all (the clock went back, a hash deleted by hand): re-place
      place(okey)
    end
  end
end
return out

-- take = record.lua .. inbox.lua .. this.
-- ARGV[3]: lease_ms. Reply: the leased entry, or nil.
local lease = tonumber(ARGV[3])
for _, okey in ipairs(redis.call('ZRANGEBYSCORE', K_WAIT, '-inf', fmt(now))) do
  place(okey)
end
while true do
  local first = redis.call('ZRANGE', K_READY, 0, 0)
  if not first[1] then
    return false
  end
  local okey = first[1]
  local head = redis.call('ZRANGE', kkey(okey), 0, 0)
  local e = nil
  if head[1] then
    e = load_entry(head[1])
  end
  if e and due_at(e) <= now then
    e.status = 'in_flight'
    e.attempts = e.attempts + 1
    e.token = e.token + 1
    e.lease = now + lease
    redis.call('HSET', ekey(e.id), 'status', e.status, 'attempts', fmt(e.attempts),
               'token', fmt(e.token), 'lease', fmt(e.lease))
    mark(e.id, 'in_flight', e.adm)
    place(okey)
    return entry_reply(e)
  end
  -- not takeable after all (the clock went back, or a dangling id): re-place, go on
  place(okey)
end

-- take = record.lua .. inbox.lua .. this.
-- ARGV[3]: lease_ms; ARGV[4]: 'peek' (a sharded inbox's first step) or absent.
-- Reply: the leased entry, or nil; peek: the seq of the oldest takeable head, or nil
-- (nothing leased; only the keys that came due are moved to READY).
local lease = tonumber(ARGV[3])
for _, okey in ipairs(redis.call('ZRANGEBYSCORE', K_WAIT, '-inf', fmt(now))) do
  place(okey)
end
if ARGV[4] == 'peek' then
  local first = redis.call('ZRANGE', K_READY, 0, 0, 'WITHSCORES')
  return first[2] or false
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

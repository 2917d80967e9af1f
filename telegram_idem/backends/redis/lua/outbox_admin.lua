-- admin (redrive / resolve / unpark) = record.lua .. outbox.lua .. this.
-- ARGV[2]: op; [3]: key (redrive, resolve) or unit (unpark); [4]: result (resolve).
-- Reply: 1 | 0 (redrive, resolve: done or not in a status it applies to); unpark: how
-- many entries went back to pending; redrive: 'stale' (see stale()).
local op = ARGV[2]
if op == 'unpark' then
  local okey = ARGV[3]
  redis.call('SREM', K_PARKED, okey)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGE', pkey(okey), 0, -1)) do
    local e = load(m, false)
    if e and e.status == 'parked' then
      restatus(e, 'pending')
      redis.call('HSET', ekey(m), 'status', 'pending', 'avail', fmt(now), 'lease', '0',
                 'sat', '0')
      join_live(e)
      n = n + 1
    end
  end
  redis.call('DEL', pkey(okey))
  place(okey)
  return n
end
local k = ARGV[3]
local e = load(k, false)
if e == nil then
  return 0
end
if op == 'redrive' then
  if e.status ~= 'dead' and e.status ~= 'unknown' and e.status ~= 'parked' then
    return 0
  end
  if stale() then
    return 'stale'
  end
  if e.status == 'parked' then
    redis.call('ZREM', pkey(e.okey), k)
  end
  -- the back of its chat (a new seq): a later entry of the chat may be in flight already
  redis.call('ZREM', skey(e.status), k)
  e.seq = next_seq()
  e.status = 'pending'
  redis.call('ZADD', skey('pending'), fmt(e.seq), k)
  redis.call('HSET', ekey(k), 'status', 'pending', 'seq', fmt(e.seq), 'att', '0',
             'avail', fmt(now), 'lease', '0', 'sat', '0')
  redis.call('ZADD', kkey(e.okey), fmt(e.seq), k)
  if e.ckey then
    redis.call('SADD', ckey(e.ckey), k)
  end
  place(e.okey)
  return 1
elseif op == 'resolve' then
  if e.status ~= 'unknown' then
    return 0
  end
  restatus(e, 'delivered')
  expire_later(e)
  redis.call('HSET', ekey(k), 'status', 'delivered', 'res', ARGV[4], 'sat', fmt(e.sat),
             'exp', fmt(e.exp))
  return 1
end
return redis.error_reply('unknown outbox operation ' .. op)

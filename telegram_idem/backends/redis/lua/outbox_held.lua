-- held (deliver / retry / settle / park / extend) = record.lua .. outbox.lua .. this.
-- ARGV[2]: op; [3]: key; [4]: token; [5]: delay_ms (retry) or lease_ms (extend);
-- [6]: result (deliver), error (retry, settle, park); [7]: the status (settle: dead |
-- unknown); [8]: '1' when [9] replaces params; [10]: '1' when [11] replaces the unit.
-- Reply: 1, or 0 when the entry is not in flight with this token (nothing written).
local op, k = ARGV[2], ARGV[3]
local e = load(k, false)
if e == nil or e.status ~= 'in_flight' or e.tok ~= tonumber(ARGV[4]) then
  return 0
end
if op == 'deliver' then
  leave_live(e)
  restatus(e, 'delivered')
  expire_later(e)
  redis.call('HSET', ekey(k), 'status', 'delivered', 'res', ARGV[6], 'sat', fmt(e.sat),
             'exp', fmt(e.exp), 'lease', '0')
  place(e.okey)
elseif op == 'retry' then
  restatus(e, 'pending')
  local avail = now + tonumber(ARGV[5])
  redis.call('HSET', ekey(k), 'status', 'pending', 'avail', fmt(avail), 'lease', '0',
             'err', ARGV[6])
  if ARGV[8] == '1' then
    redis.call('HSET', ekey(k), 'params', ARGV[9])
  end
  if ARGV[10] == '1' and ARGV[11] ~= e.okey then
    local from = e.okey
    redis.call('ZREM', kkey(from), k)
    e.okey = ARGV[11]
    redis.call('HSET', ekey(k), 'okey', e.okey)
    if redis.call('SISMEMBER', K_PARKED, e.okey) == 1 then
      -- the new chat is parked: the entry waits with it
      if e.ckey then
        redis.call('SREM', ckey(e.ckey), k)
      end
      restatus(e, 'parked')
      redis.call('HSET', ekey(k), 'status', 'parked', 'sat', fmt(now))
      redis.call('ZADD', pkey(e.okey), fmt(e.seq), k)
    else
      if e.ckey then
        redis.call('SREM', ckey(e.ckey), k)
      end
      join_live(e)
    end
    place(from)
  end
  place(e.okey)
elseif op == 'settle' then
  leave_live(e)
  restatus(e, ARGV[7])
  redis.call('HSET', ekey(k), 'status', ARGV[7], 'err', ARGV[6], 'sat', fmt(now), 'lease', '0')
  place(e.okey)
elseif op == 'park' then
  redis.call('SADD', K_PARKED, e.okey)
  local members = redis.call('ZRANGE', kkey(e.okey), 0, -1)
  for _, m in ipairs(members) do
    local p = load(m, false)
    if p and (p.status == 'pending' or p.status == 'in_flight') then
      leave_live(p)
      restatus(p, 'parked')
      redis.call('ZADD', pkey(p.okey), fmt(p.seq), m)
      redis.call('HSET', ekey(m), 'status', 'parked', 'sat', fmt(now), 'lease', '0')
    else
      redis.call('ZREM', kkey(e.okey), m)
    end
  end
  redis.call('HSET', ekey(k), 'err', ARGV[6])
  place(e.okey)
elseif op == 'extend' then
  redis.call('HSET', ekey(k), 'lease', fmt(now + tonumber(ARGV[5])))
  place(e.okey)
else
  return redis.error_reply('unknown outbox operation ' .. op)
end
return 1

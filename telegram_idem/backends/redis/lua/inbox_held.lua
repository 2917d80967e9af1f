-- held (ack / retry / bury / extend) = record.lua .. inbox.lua .. this.
-- ARGV[3]: ack | retry | bury | extend; ARGV[4]: id; ARGV[5]: token;
-- ARGV[6]: delay_ms (retry) or lease_ms (extend); ARGV[7]: error (retry, bury);
-- ARGV[8]: '1' when a retry refunds its take (attempts - 1, never below 0).
-- Reply: 1, or 0 when the entry is not in flight with this token.
local op, id = ARGV[3], ARGV[4]
local e = load_entry(id)
if e == nil or e.status ~= 'in_flight' or e.token ~= tonumber(ARGV[5]) then
  return 0
end
if op == 'ack' then
  leave_marker(e)
  redis.call('DEL', ekey(id))
  redis.call('ZREM', kkey(e.okey), id)
  redis.call('ZREM', K_LIVE, id)
  mark(id, nil, 0)
elseif op == 'retry' then
  redis.call('HSET', ekey(id), 'status', 'pending', 'avail', fmt(now + tonumber(ARGV[6])),
             'lease', '0', 'err', ARGV[7])
  if ARGV[8] == '1' and e.attempts > 0 then
    redis.call('HSET', ekey(id), 'attempts', fmt(e.attempts - 1))
  end
  mark(id, 'pending', e.adm)
elseif op == 'bury' then
  redis.call('HSET', ekey(id), 'status', 'dead', 'err', ARGV[7])
  redis.call('ZREM', kkey(e.okey), id)
  redis.call('ZREM', K_LIVE, id)
  redis.call('ZADD', K_DEAD, fmt(e.seq), id)
  mark(id, 'dead', e.adm)
elseif op == 'extend' then
  redis.call('HSET', ekey(id), 'lease', fmt(now + tonumber(ARGV[6])))
else
  return redis.error_reply('unknown inbox operation ' .. op)
end
place(e.okey)
return 1

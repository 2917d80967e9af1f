-- redrive = record.lua .. inbox.lua .. this.
-- ARGV[3]: id; ARGV[4] (a sharded inbox): the seq reserved store-wide, the least the new
-- seq may be. Reply: 1, or 0 when it is not a dead letter.
local id = ARGV[3]
local e = load_entry(id)
if e == nil or e.status ~= 'dead' then
  return 0
end
-- Back of its chat (a new seq): a later entry of the chat may be in flight already.
local seq = redis.call('INCR', K_SEQ)
if ARGV[4] and tonumber(ARGV[4]) > seq then
  seq = tonumber(ARGV[4])
  redis.call('SET', K_SEQ, fmt(seq))
end
redis.call('HSET', ekey(id), 'status', 'pending', 'attempts', '0', 'avail', fmt(now), 'seq', seq)
redis.call('ZREM', K_DEAD, id)
redis.call('ZADD', kkey(e.okey), seq, id)
redis.call('ZADD', K_LIVE, seq, id)
mark(id, 'pending', e.adm)
place(e.okey)
return 1

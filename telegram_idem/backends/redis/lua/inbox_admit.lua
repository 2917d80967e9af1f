-- admit = record.lua .. inbox.lua .. decide_claim.lua .. this.
-- KEYS[6..]: the update guard record of each entry.
-- ARGV[3]: retention_ms; then id, ordering key, payload for each entry, in KEYS order.
-- Reply: 1 (admitted) or 0 (duplicate: nothing written) per entry.
local retention = tonumber(ARGV[3])
local out = {}
for i = 6, #KEYS do
  local j = 4 + (i - 6) * 3
  local gkey, id, okey, payload = KEYS[i], ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local outcome, r = decide_claim(gkey, now, retention, retention, false)
  if outcome == 'acquired' then
    -- logic.admitted_record: acquired with lease = retention, then completed with null
    r.status = 'completed'
    r.result = 'null'
    r.exp = now + retention
    save(gkey, r, now)
    -- An entry still here under this id outlived its guard record (retention over):
    -- the new admission replaces it, keeping its token so an old taker stays fenced.
    local token = 0
    local old = load_entry(id)
    if old then
      token = old.token
      redis.call('DEL', ekey(id))
      redis.call('ZREM', kkey(old.okey), id)
      redis.call('ZREM', K_LIVE, id)
      redis.call('ZREM', K_DEAD, id)
      place(old.okey)
    end
    local seq = redis.call('INCR', K_SEQ)
    redis.call('HSET', ekey(id), 'seq', fmt(seq), 'okey', okey, 'payload', payload,
               'status', 'pending', 'attempts', '0', 'token', fmt(token),
               'avail', fmt(now), 'lease', '0', 'adm', fmt(now))
    redis.call('ZADD', kkey(okey), fmt(seq), id)
    redis.call('ZADD', K_LIVE, fmt(seq), id)
    mark(id, 'pending', now)
    place(okey)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

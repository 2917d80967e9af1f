-- write = record.lua .. inbox.lua .. this: a sharded inbox's admission writes its
-- entries in their shard (step 2, between the guard's claim and its completion; see
-- telegram_idem/backends/redis/_inbox.py). KEYS[1..5]: the shard's keys.
-- ARGV[3..]: per entry, 7 values: id, ordering key, payload, seq (reserved store-wide),
-- gtok (the guard token this admission holds), prev (the token it took over from a
-- claim in progress, -1 when none), gexp (the guard's retention end, ms).
-- Reply per entry: 1 written; 2 kept (this update's entry, or its done marker T:g:<id>,
-- was written by the admission this one took over: the same admission, finished now);
-- 0 superseded (a later admission of the update holds it: write nothing, do not
-- complete the guard).
local out = {}
local n = (#ARGV - 2) / 7
for k = 0, n - 1 do
  local j = 3 + k * 7
  local id, okey, payload = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local want, gtok, prev, gexp = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]),
    tonumber(ARGV[j + 5]), ARGV[j + 6]
  local old = load_entry(id)
  local tomb = redis.call('GET', BASE .. 'g:' .. id)
  local answer = 1
  if old and old.gtok then
    if old.gexp > now and old.gtok > gtok then
      answer = 0
    elseif old.gtok == prev then
      redis.call('HSET', ekey(id), 'gtok', fmt(gtok), 'gexp', gexp)
      answer = 2
    end
  elseif (not old) and tomb then
    local t = tonumber(tomb)
    if t > gtok then
      answer = 0
    elseif t == prev then
      redis.call('SET', BASE .. 'g:' .. id, fmt(gtok), 'PX', fmt(math.max(tonumber(gexp) - now, 1)))
      answer = 2
    end
  end
  if answer == 1 then
    -- new, or an entry that outlived its guard record: replaced, keeping its token
    -- so a worker still holding the old entry stays fenced (as inbox_admit.lua)
    local token = 0
    if old then
      token = old.token
      redis.call('DEL', ekey(id))
      redis.call('ZREM', kkey(old.okey), id)
      redis.call('ZREM', K_LIVE, id)
      redis.call('ZREM', K_DEAD, id)
      place(old.okey)
    end
    redis.call('DEL', BASE .. 'g:' .. id)
    -- after every seq of this shard (a chat's new entry goes to its tail), and at
    -- least the store-wide one reserved (seqs compare across shards)
    local seq = redis.call('INCR', K_SEQ)
    if want > seq then
      seq = want
      redis.call('SET', K_SEQ, fmt(seq))
    end
    redis.call('HSET', ekey(id), 'seq', fmt(seq), 'okey', okey, 'payload', payload,
               'status', 'pending', 'attempts', '0', 'token', fmt(token),
               'avail', fmt(now), 'lease', '0', 'adm', fmt(now), 'gtok', fmt(gtok),
               'gexp', gexp)
    redis.call('ZADD', kkey(okey), fmt(seq), id)
    redis.call('ZADD', K_LIVE, fmt(seq), id)
    mark(id, 'pending', now)
    place(okey)
  end
  out[#out + 1] = answer
end
return out

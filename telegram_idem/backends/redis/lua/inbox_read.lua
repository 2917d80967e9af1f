-- read (get / entries / stats / backlog) = record.lua .. inbox.lua .. this. Writes
-- nothing, except that stats files entries left unfiled by an older version (see there).
-- ARGV[3]: op.
--   get: ARGV[4] id. Reply: the entry, or nil.
--   entries: ARGV[4] status ('' = any), ARGV[5] ordering key ('' = any), ARGV[6] after
--     (a seq: only entries with a larger one), ARGV[7] limit (>= 1), ARGV[8] budget (most
--     members read from each source zset by this call). Reply: {cursor, done, entry...}:
--     the matching entries in seq order, at most limit; read on from cursor until done.
--   stats: Reply: {now_ms, status, n, oldest_adm_ms, ...} for each status with entries,
--     from T:a:<status>: O(1).
--   depth: Reply: how many live entries (ZCARD of T:live).
--   backlog: ARGV[4] limit. Reply: {okey, pending, in_flight, oldest_adm_ms} per unit,
--     the most live entries first (ties: the oldest, then the key).
local op = ARGV[3]

if op == 'get' then
  local e = load_entry(ARGV[4])
  if e == nil then
    return false
  end
  return entry_reply(e)

elseif op == 'entries' then
  local status, okey = ARGV[4], ARGV[5]
  local after, limit, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  -- The sources, each a zset of ids by seq: the live entries (of one ordering key when
  -- given: T:k:<okey>) unless only dead letters are wanted, and the dead letters unless
  -- only live entries are.
  if status == 'in_flight' and okey == '' then
    -- few (at most one per ordering key): all of T:a:in_flight, in seq order
    local held = {}
    for _, id in ipairs(redis.call('ZRANGE', akey('in_flight'), 0, -1)) do
      local e = load_entry(id)
      if e and e.status == 'in_flight' and e.seq > after then
        held[#held + 1] = e
      end
    end
    table.sort(held, function(a, b) return a.seq < b.seq end)
    local out = {}
    for i = 1, math.min(#held, limit) do
      out[#out + 1] = entry_reply(held[i])
    end
    return {fmt(after), 1, unpack(out)}
  end
  local sources = {}
  if status ~= 'dead' then
    sources[#sources + 1] = (okey ~= '' and kkey(okey)) or K_LIVE
  end
  if status == '' or status == 'dead' then
    sources[#sources + 1] = K_DEAD
  end
  -- Every candidate up to bound is read: a source that filled its budget is read only
  -- up to its last seq, so the merge stops there.
  local bound = math.huge
  local cands = {}
  for _, src in ipairs(sources) do
    local got = redis.call('ZRANGEBYSCORE', src, '(' .. fmt(after), '+inf', 'WITHSCORES',
                           'LIMIT', 0, budget)
    for i = 1, #got, 2 do
      cands[#cands + 1] = {got[i], tonumber(got[i + 1])}
    end
    if #got / 2 >= budget then
      bound = math.min(bound, tonumber(got[#got]))
    end
  end
  table.sort(cands, function(a, b) return a[2] < b[2] end)
  local out = {}
  for _, c in ipairs(cands) do
    if c[2] > bound then
      break
    end
    local e = load_entry(c[1])
    if e and (status == '' or e.status == status) and (okey == '' or e.okey == okey) then
      out[#out + 1] = entry_reply(e)
      if #out >= limit then
        return {fmt(c[2]), 0, unpack(out)}
      end
    end
  end
  if bound == math.huge then
    return {fmt(after), 1, unpack(out)}
  end
  return {fmt(bound), 0, unpack(out)}

elseif op == 'stats' then
  -- Every entry is filed under its status in T:a:<status> (mark). Entries written by a
  -- version before those sets are not: then the sets are rebuilt from T:live and T:dead
  -- once (a walk of every entry), and ids whose hash is gone are forgotten.
  local total = redis.call('ZCARD', K_LIVE) + redis.call('ZCARD', K_DEAD)
  local filed = 0
  for _, s in ipairs(STATUSES) do
    filed = filed + redis.call('ZCARD', akey(s))
  end
  if filed ~= total then
    for _, s in ipairs(STATUSES) do
      redis.call('DEL', akey(s))
    end
    for _, src in ipairs({K_LIVE, K_DEAD}) do
      for _, id in ipairs(redis.call('ZRANGE', src, 0, -1)) do
        local v = redis.call('HMGET', ekey(id), 'status', 'adm')
        if v[1] then
          redis.call('ZADD', akey(v[1]), v[2] or '0', id)
        else
          redis.call('ZREM', src, id)
        end
      end
    end
  end
  local out = {fmt(now)}
  for _, s in ipairs(STATUSES) do
    local n = redis.call('ZCARD', akey(s))
    if n > 0 then
      local first = redis.call('ZRANGE', akey(s), 0, 0, 'WITHSCORES')
      out[#out + 1] = s
      out[#out + 1] = n
      out[#out + 1] = fmt(tonumber(first[2]))
    end
  end
  return out

elseif op == 'depth' then
  return redis.call('ZCARD', K_LIVE)

elseif op == 'backlog' then
  local units = {}
  for _, zone in ipairs({K_READY, K_WAIT}) do -- every key with live entries is in one
    for _, okey in ipairs(redis.call('ZRANGE', zone, 0, -1)) do
      local u = {okey = okey, pending = 0, in_flight = 0, oldest = math.huge}
      for _, id in ipairs(redis.call('ZRANGE', kkey(okey), 0, -1)) do
        local v = redis.call('HMGET', ekey(id), 'status', 'adm')
        if v[1] == 'pending' then
          u.pending = u.pending + 1
        elseif v[1] == 'in_flight' then
          u.in_flight = u.in_flight + 1
        end
        if v[1] then
          u.oldest = math.min(u.oldest, tonumber(v[2] or '0'))
        end
      end
      if u.pending + u.in_flight > 0 then
        units[#units + 1] = u
      end
    end
  end
  table.sort(units, function(a, b)
    local na, nb = a.pending + a.in_flight, b.pending + b.in_flight
    if na ~= nb then
      return na > nb
    end
    if a.oldest ~= b.oldest then
      return a.oldest < b.oldest
    end
    return a.okey < b.okey
  end)
  local out = {}
  for i = 1, math.min(#units, tonumber(ARGV[4])) do
    local u = units[i]
    out[#out + 1] = {u.okey, u.pending, u.in_flight, fmt(u.oldest)}
  end
  return out
end
return redis.error_reply('unknown inbox operation ' .. op)

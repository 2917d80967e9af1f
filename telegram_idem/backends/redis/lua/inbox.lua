-- After record.lua: the inbox helpers every inbox script starts with (key names,
-- load_entry, mark, due_at, place, entry_reply). Layout: telegram_idem/backends/redis/_inbox.py.
-- KEYS[1..5]: T:seq, T:live, T:ready, T:wait, T:dead (one slot).
-- ARGV[1]: now_ms|''; ARGV[2]: T: (the inbox key base, with the trailing colon).
local K_SEQ, K_LIVE, K_READY, K_WAIT, K_DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local BASE = ARGV[2]
local now = now_ms(ARGV[1])

local function ekey(id)
  return BASE .. 'e:' .. id
end

local function kkey(okey)
  return BASE .. 'k:' .. okey
end

local function load_entry(id)
  local v = redis.call('HMGET', ekey(id), 'seq', 'okey', 'status', 'attempts', 'token',
                       'avail', 'lease', 'adm', 'gtok', 'gexp')
  if not v[1] then
    return nil
  end
  -- adm (admitted_at, ms) is absent from entries admitted before it was recorded: 0;
  -- gtok / gexp (the guard token and retention end of a sharded admission, inbox_write)
  -- are absent from one-shard entries: nil
  return {id = id, seq = tonumber(v[1]), okey = v[2], status = v[3],
          attempts = tonumber(v[4]), token = tonumber(v[5]), avail = tonumber(v[6]),
          lease = tonumber(v[7]), adm = tonumber(v[8] or '0'), gtok = tonumber(v[9] or ''),
          gexp = tonumber(v[10] or '')}
end

-- An entry of a sharded admission leaves, when acked or dropped, the marker T:g:<id>
-- (its guard token) until its guard's retention ends: a re-admission that takes over
-- the guard from the same admission (it crashed before completing the guard) then
-- finds the update done instead of enqueuing it again (inbox_write.lua).
local function leave_marker(e)
  if e.gtok and e.gexp and e.gexp > now then
    redis.call('SET', BASE .. 'g:' .. e.id, fmt(e.gtok), 'PX', fmt(e.gexp - now))
  end
end

-- T:a:<status>: the entries of each status by admission time (adm, ms), for stats.
local STATUSES = {'pending', 'in_flight', 'dead'}

local function akey(status)
  return BASE .. 'a:' .. status
end

-- File entry id under status (scored adm), out of the other statuses; status nil: out
-- of all of them (the entry is gone).
local function mark(id, status, adm)
  for _, s in ipairs(STATUSES) do
    if s == status then
      redis.call('ZADD', akey(s), fmt(adm), id)
    else
      redis.call('ZREM', akey(s), id)
    end
  end
end

-- When a live entry becomes takeable: a pending one when due, an in-flight one when its
-- lease ends (its worker died).
local function due_at(e)
  if e.status == 'in_flight' then
    return e.lease
  end
  return e.avail
end

-- Put ordering key okey where take finds it: in READY (by its head's seq) when its head
-- is takeable now, else in WAIT (by when it will be); in neither without live entries.
local function place(okey)
  while true do
    local head = redis.call('ZRANGE', kkey(okey), 0, 0)
    if not head[1] then
      redis.call('ZREM', K_READY, okey)
      redis.call('ZREM', K_WAIT, okey)
      return
    end
    local e = load_entry(head[1])
    if e then
      local at = due_at(e)
      if at <= now then
        redis.call('ZADD', K_READY, fmt(e.seq), okey)
        redis.call('ZREM', K_WAIT, okey)
      else
        redis.call('ZADD', K_WAIT, fmt(at), okey)
        redis.call('ZREM', K_READY, okey)
      end
      return
    end
    -- an id whose entry hash is gone (deleted by hand): forget it
    redis.call('ZREM', kkey(okey), head[1])
    redis.call('ZREM', K_LIVE, head[1])
    mark(head[1], nil, 0)
  end
end

local function entry_reply(e)
  local v = redis.call('HMGET', ekey(e.id), 'payload', 'err')
  return {e.id, e.seq, e.okey, v[1], e.status, e.attempts, e.token, e.avail, e.lease,
          v[2] or false, e.adm}
end

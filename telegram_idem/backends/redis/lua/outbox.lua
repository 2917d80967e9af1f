-- After record.lua: the outbox helpers every outbox script starts with (key names,
-- load, reply, place, leave_live, cleanup). Layout: telegram_idem/backends/redis/_outbox.py.
-- KEYS[1]: B, the bot's key base ('<p>:{<p>:outbox:<bot_id>}:', one slot);
-- KEYS[2]: the seq counter (store-wide on a single node, B..'seq' on a cluster).
-- ARGV[1]: now_ms|''; the last ARGV: the seq floor (0 on a single node; on a cluster a
-- fresh value of the store-wide counter, for the scripts that take a new seq).
local B, K_SEQ = KEYS[1], KEYS[2]
local K_WAIT, K_PRIOS, K_RP, K_X, K_PARKED = B .. 'wait', B .. 'prios', B .. 'rp', B .. 'x',
  B .. 'parked'
local now = now_ms(ARGV[1])
local FLOOR = tonumber(ARGV[#ARGV]) or 0

local function last_seq()
  return tonumber(redis.call('GET', K_SEQ) or '0')
end

-- On a cluster: the floor was drawn before a seq of this bot that is larger (two
-- enqueues raced): the caller draws another (store-wide seqs stay unique, increasing).
local function stale()
  return FLOOR > 0 and FLOOR <= last_seq()
end

-- The next seq: above every seq of this bot, and the floor when there is one.
local function next_seq()
  local s = math.max(last_seq() + 1, FLOOR)
  redis.call('SET', K_SEQ, fmt(s))
  return s
end

local function ekey(k) return B .. 'e:' .. k end
local function kkey(okey) return B .. 'k:' .. okey end
local function pkey(okey) return B .. 'p:' .. okey end
local function ckey(c) return B .. 'c:' .. c end
local function skey(status) return B .. 's:' .. status end
local function rkey(prio) return B .. 'r:' .. prio end

local NUMBERS = {seq = true, prio = true, ret = true, att = true, tok = true, cat = true,
                 avail = true, lease = true, sat = true, exp = true}
local LIGHT = {'seq', 'okey', 'ckey', 'prio', 'ret', 'status', 'att', 'tok', 'avail', 'lease',
               'sat', 'exp'}
local FULL = {'seq', 'okey', 'ckey', 'prio', 'ret', 'status', 'att', 'tok', 'avail', 'lease',
              'sat', 'exp', 'method', 'params', 'policy', 'cat', 'res', 'err'}

-- The entry stored under key k (its fields: LIGHT, or FULL with full), or nil. An entry
-- whose retention ended (exp passed on the store's clock) counts as absent.
local function load(k, full)
  local names = full and FULL or LIGHT
  local v = redis.call('HMGET', ekey(k), unpack(names))
  if not v[1] then
    return nil
  end
  local e = {key = k}
  for i, name in ipairs(names) do
    if NUMBERS[name] then
      e[name] = tonumber(v[i])
    else
      e[name] = v[i]
    end
  end
  if e.exp > 0 and e.exp <= now then
    return nil
  end
  return e
end

local function reply(e)
  return {e.key, e.seq, e.method, e.params, e.okey, e.ckey or false, e.policy, e.prio, e.ret,
          e.status, e.att, e.tok, e.cat, e.avail, e.lease, e.sat, e.res or false,
          e.err or false}
end

-- Move entry e from status e.status to status (the status index), and record it.
local function restatus(e, status)
  redis.call('ZREM', skey(e.status), e.key)
  redis.call('ZADD', skey(status), fmt(e.seq), e.key)
  e.status = status
end

-- A delivered or superseded entry: kept ret ms from now, then gone (PEXPIRE; the x
-- index lets later scripts drop it from the status index).
local function expire_later(e)
  e.sat = now
  e.exp = now + e.ret
  redis.call('ZADD', K_X, fmt(e.exp), e.key)
  redis.call('PEXPIRE', ekey(e.key), fmt(math.max(e.ret, 1)))
end

-- Drop the entries whose retention ended: at most limit of them (-1: all).
local function cleanup(limit)
  local due
  if limit < 0 then
    due = redis.call('ZRANGEBYSCORE', K_X, '-inf', fmt(now))
  else
    due = redis.call('ZRANGEBYSCORE', K_X, '-inf', fmt(now), 'LIMIT', 0, limit)
  end
  for _, k in ipairs(due) do
    local v = redis.call('HMGET', ekey(k), 'status', 'exp')
    local exp = tonumber(v[2] or '0')
    if v[1] and (exp == 0 or exp > now) then
      if exp > 0 then
        redis.call('ZADD', K_X, fmt(exp), k)
      else
        redis.call('ZREM', K_X, k)
      end
    else
      redis.call('DEL', ekey(k))
      redis.call('ZREM', skey('delivered'), k)
      redis.call('ZREM', skey('superseded'), k)
      redis.call('ZREM', K_X, k)
    end
  end
end

local function unready(okey)
  local p = redis.call('HGET', K_RP, okey)
  if p then
    redis.call('ZREM', rkey(p), okey)
    if redis.call('ZCARD', rkey(p)) == 0 then
      redis.call('ZREM', K_PRIOS, p)
    end
    redis.call('HDEL', K_RP, okey)
  end
end

-- When a live entry can be taken: a pending one when due, an in-flight one when its
-- lease ends (its relay died).
local function due_at(e)
  if e.status == 'in_flight' then
    return e.lease
  end
  return e.avail
end

-- Put chat okey where take finds it: in r:<prio> (by its head's seq) when its head is
-- takeable now, else in wait (by when it will be); in neither without live entries.
local function place(okey)
  unready(okey)
  redis.call('ZREM', K_WAIT, okey)
  while true do
    local head = redis.call('ZRANGE', kkey(okey), 0, 0)
    if not head[1] then
      return
    end
    local e = load(head[1], false)
    if e and (e.status == 'pending' or e.status == 'in_flight') then
      local at = due_at(e)
      if at <= now then
        local p = fmt(e.prio)
        redis.call('ZADD', rkey(p), fmt(e.seq), okey)
        redis.call('ZADD', K_PRIOS, p, p)
        redis.call('HSET', K_RP, okey, p)
      else
        redis.call('ZADD', K_WAIT, fmt(at), okey)
      end
      return
    end
    -- not live (an entry hash deleted by hand): forget it
    redis.call('ZREM', kkey(okey), head[1])
  end
end

-- e leaves its chat (delivered, superseded, dead, unknown, parked): it no longer holds
-- the chat's turn nor takes part in collapse.
local function leave_live(e)
  redis.call('ZREM', kkey(e.okey), e.key)
  if e.ckey then
    redis.call('SREM', ckey(e.ckey), e.key)
  end
end

-- e (pending now) joins chat okey: at its own seq when the chat has no live entry, else
-- at the back (a new seq), so a chat's head is always its oldest live entry.
local function join_live(e)
  if redis.call('ZCARD', kkey(e.okey)) > 0 then
    local seq = next_seq()
    redis.call('ZREM', skey(e.status), e.key)
    e.seq = seq
    redis.call('ZADD', skey(e.status), fmt(seq), e.key)
    redis.call('HSET', ekey(e.key), 'seq', fmt(seq))
  end
  redis.call('ZADD', kkey(e.okey), fmt(e.seq), e.key)
  if e.ckey then
    redis.call('SADD', ckey(e.ckey), e.key)
  end
end

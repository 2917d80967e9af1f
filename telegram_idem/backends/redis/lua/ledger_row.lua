-- The ledger helpers every ledger script starts with (the clock, load/save of a row,
-- the reply shape). Layout and replies: telegram_idem/backends/redis/_ledger.py.
-- KEYS[1]: the index (zset: keys by started_at, integer microseconds);
-- KEYS[2]: the row's hash ('<base>r:<key>'), or for ledger_entries the rows' common
-- start ('<base>r:'); both in one slot (hash tag '{<key_prefix>:ledger}').
-- ARGV[1]: now_us|'' (the injected clock, or '' to read the server's TIME).
local K_INDEX = KEYS[1]

local function fmt(n)
  return string.format('%d', n)
end

local function now_us(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

local FIELDS = {'st', 'tok', 'sat', 'hol', 'att', 'uat', 'det', 'res', 'na'}

-- The row of ledger key `key` in hash `rkey`, or nil.
local function load(rkey, key)
  local v = redis.call('HMGET', rkey, unpack(FIELDS))
  if not v[1] then
    return nil
  end
  return {key = key, st = v[1], tok = tonumber(v[2]), sat = v[3], hol = v[4],
          att = tonumber(v[5]), uat = v[6], det = v[7], res = v[8], na = v[9]}
end

-- Write row r (every field; `res` absent when r.res is nil). No TTL: rows never expire.
local function save(rkey, r)
  redis.call('HSET', rkey, 'st', r.st, 'tok', fmt(r.tok), 'sat', r.sat, 'hol', r.hol,
             'att', fmt(r.att), 'uat', r.uat, 'det', r.det, 'na', r.na)
  if r.res then
    redis.call('HSET', rkey, 'res', r.res)
  else
    redis.call('HDEL', rkey, 'res')
  end
end

local function reply(r)
  return {r.key, r.st, fmt(r.tok), r.sat, r.hol, fmt(r.att), r.uat, r.det, r.res or false,
          r.na}
end

-- enqueue = record.lua .. outbox.lua .. this.
-- ARGV[2]: key; [3]: method; [4]: params; [5]: unit (ordering key, or the key);
-- [6]: collapse key or ''; [7]: '1' when there is a collapse key; [8]: policy;
-- [9]: priority; [10]: retention_ms; [11]: the superseded entries' result JSON.
-- [12]: the bot id. KEYS[3] (a single node only): D:bots, the store-wide set of bots
-- with an outbox, which every enqueue re-adds the bot to (idempotent SADD), so a set lost
-- with Redis's data comes back with the next send; on a cluster (another slot) the
-- caller adds the bot along with its INCR of the seq counter.
-- Reply: {1 | 0 (stored already: nothing written), entry}, or 'stale' (see stale()).
if KEYS[3] then
  redis.call('SADD', KEYS[3], ARGV[12])
end
cleanup(100)
local k = ARGV[2]
local old = load(k, true)
if old then
  return {0, reply(old)}
end
if stale() then
  return 'stale'
end
-- a settled entry past its retention that Redis still holds (a test clock): replace it
if redis.call('EXISTS', ekey(k)) == 1 then
  local st = redis.call('HGET', ekey(k), 'status')
  redis.call('ZREM', skey(st), k)
  redis.call('ZREM', K_X, k)
  redis.call('DEL', ekey(k))
end
local okey, ck = ARGV[5], false
if ARGV[7] == '1' then
  ck = ARGV[6]
end
-- latest wins: every pending entry with this collapse key is superseded by this one
if ck then
  local touched = {}
  for _, m in ipairs(redis.call('SMEMBERS', ckey(ck))) do
    local e = load(m, false)
    if e == nil then
      redis.call('SREM', ckey(ck), m)
    elseif e.status == 'pending' then
      leave_live(e)
      restatus(e, 'superseded')
      expire_later(e)
      redis.call('HSET', ekey(m), 'status', 'superseded', 'res', ARGV[11], 'sat', fmt(e.sat),
                 'exp', fmt(e.exp), 'lease', '0')
      touched[e.okey] = true
    end
  end
  for o, _ in pairs(touched) do
    place(o)
  end
end
local status = 'pending'
if redis.call('SISMEMBER', K_PARKED, okey) == 1 then
  status = 'parked'
end
local seq = next_seq()
local e = {key = k, seq = seq, method = ARGV[3], params = ARGV[4], okey = okey, ckey = ck,
           policy = ARGV[8], prio = tonumber(ARGV[9]), ret = tonumber(ARGV[10]),
           status = status, att = 0, tok = 0, cat = now, avail = now, lease = 0, sat = 0,
           exp = 0, res = false, err = false}
if status == 'parked' then
  e.sat = now
end
local fields = {'seq', fmt(seq), 'method', e.method, 'params', e.params, 'okey', okey,
                'policy', e.policy, 'prio', fmt(e.prio), 'ret', fmt(e.ret), 'status', status,
                'att', '0', 'tok', '0', 'cat', fmt(now), 'avail', fmt(now), 'lease', '0',
                'sat', fmt(e.sat), 'exp', '0'}
if ck then
  fields[#fields + 1] = 'ckey'
  fields[#fields + 1] = ck
end
redis.call('HSET', ekey(k), unpack(fields))
redis.call('ZADD', skey(status), fmt(seq), k)
if status == 'parked' then
  redis.call('ZADD', pkey(okey), fmt(seq), k)
else
  redis.call('ZADD', kkey(okey), fmt(seq), k)
  if ck then
    redis.call('SADD', ckey(ck), k)
  end
  place(okey)
end
return {1, reply(e)}

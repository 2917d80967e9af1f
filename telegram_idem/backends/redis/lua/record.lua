-- The record helpers every record and inbox script starts with: number formatting,
-- the clock (now_ms), load/save of a record hash, the reply shape, the holder test.
-- Layout and replies: telegram_idem/backends/redis/_scripts.py.

local function fmt(n)
  return string.format('%d', n)
end

local function now_ms(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

local function load(key)
  local v = redis.call('HMGET', key, 'status', 'token', 'lease', 'exp', 'fp', 'result',
                       'attempts')
  if not v[1] then
    return nil
  end
  return {status = v[1], token = tonumber(v[2]), lease = tonumber(v[3]),
          exp = tonumber(v[4]), fp = v[5], result = v[6], attempts = tonumber(v[7])}
end

-- save(key, r, now[, fresh]): fresh = no hash was there, so no field needs deleting.
local function save(key, r, now, fresh)
  local set = {'status', r.status, 'token', fmt(r.token), 'lease', fmt(r.lease),
               'exp', fmt(r.exp), 'attempts', fmt(r.attempts)}
  local gone = {}
  if r.fp then
    set[#set + 1] = 'fp'
    set[#set + 1] = r.fp
  else
    gone[#gone + 1] = 'fp'
  end
  if r.result then
    set[#set + 1] = 'result'
    set[#set + 1] = r.result
  else
    gone[#gone + 1] = 'result'
  end
  redis.call('HSET', key, unpack(set))
  if #gone > 0 and not fresh then
    redis.call('HDEL', key, unpack(gone))
  end
  redis.call('PEXPIRE', key, fmt(math.max(r.exp - now, 1)))
end

local function reply(outcome, r)
  return {outcome, r.status, r.token, r.lease, r.exp, r.fp or false, r.result or false,
          r.attempts}
end

local function held(r, token, now)
  return r ~= nil and r.exp > now and r.status == 'in_progress' and r.token == token
end

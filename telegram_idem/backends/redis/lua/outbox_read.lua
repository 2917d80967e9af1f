-- read (get / entries / counts / parked) = record.lua .. outbox.lua .. this.
-- ARGV[2]: op; [3]: key (get) or status (entries); [4]: limit (entries, >= 1).
-- Reply: get: the entry or nil; entries: the entries in the status, oldest (seq) first;
-- counts: {status, n, status, n, ...}; parked: the parked units.
local op = ARGV[2]
if op == 'get' then
  local e = load(ARGV[3], true)
  if e == nil then
    return false
  end
  return reply(e)
elseif op == 'entries' then
  local status = ARGV[3]
  if status == 'delivered' or status == 'superseded' then
    cleanup(-1)
  end
  local out = {}
  for _, k in ipairs(redis.call('ZRANGE', skey(status), 0, tonumber(ARGV[4]) - 1)) do
    local e = load(k, true)
    if e then
      out[#out + 1] = reply(e)
    end
  end
  return out
elseif op == 'counts' then
  cleanup(-1)
  local out = {}
  for _, status in ipairs({'pending', 'in_flight', 'delivered', 'superseded', 'unknown',
                           'dead', 'parked'}) do
    out[#out + 1] = status
    out[#out + 1] = redis.call('ZCARD', skey(status))
  end
  return out
elseif op == 'parked' then
  return redis.call('SMEMBERS', K_PARKED)
end
return redis.error_reply('unknown outbox operation ' .. op)

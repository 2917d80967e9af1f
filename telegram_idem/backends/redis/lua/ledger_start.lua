-- ledger_start = ledger_row.lua .. this.
-- ARGV: now_us|'', key, token, holder. Reply: nil if the STARTED row was written (run the
-- effect), else the existing row, unchanged.
local r = load(KEYS[2], ARGV[2])
if r then
  return reply(r)
end
local now = fmt(now_us(ARGV[1]))
save(KEYS[2], {key = ARGV[2], st = 'started', tok = tonumber(ARGV[3]), sat = now,
               hol = ARGV[4], att = 1, uat = now, det = '', na = '0'})
redis.call('ZADD', K_INDEX, now, ARGV[2])
return false

-- ledger_mark_unknown = ledger_row.lua .. this.
-- ARGV: now_us|'', key, token, detail. A STARTED or UNKNOWN row whose token is <= token
-- becomes UNKNOWN (token, detail replaced, attempts + 1, updated now); a SETTLED row or
-- an older token changes nothing. Reply: the row after, or nil when there is none.
local r = load(KEYS[2], ARGV[2])
if not r then
  return false
end
local token = tonumber(ARGV[3])
if r.st ~= 'settled' and token >= r.tok then
  r.st, r.tok, r.det, r.att = 'unknown', token, ARGV[4], r.att + 1
  r.uat = fmt(now_us(ARGV[1]))
  save(KEYS[2], r)
end
return reply(r)

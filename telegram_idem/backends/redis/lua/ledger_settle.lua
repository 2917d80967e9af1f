-- ledger_settle = ledger_row.lua .. this.
-- ARGV: now_us|'', key, token, result, not_applied ('1': result ignored, kept absent).
-- A STARTED or UNKNOWN row becomes SETTLED under the resolver's token. Reply: 1 if this
-- call settled it, 0 if there is no row or it is SETTLED already (the first stands).
local r = load(KEYS[2], ARGV[2])
if not r or r.st == 'settled' then
  return 0
end
r.st, r.tok, r.na = 'settled', tonumber(ARGV[3]), ARGV[5]
if ARGV[5] == '1' then
  r.res = nil
else
  r.res = ARGV[4]
end
r.uat = fmt(now_us(ARGV[1]))
save(KEYS[2], r)
return 1

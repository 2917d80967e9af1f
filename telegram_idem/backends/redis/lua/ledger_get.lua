-- ledger_get = ledger_row.lua .. this.
-- ARGV: now_us|'' (unused), key. Reply: the row, or nil. Writes nothing.
local r = load(KEYS[2], ARGV[2])
if not r then
  return false
end
return reply(r)

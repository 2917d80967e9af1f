-- ledger_finish = ledger_row.lua .. this.
-- ARGV: now_us|'' (unused), key, token. Deletes the row (and its index entry) only when
-- its token is token. Reply: 1 if deleted, else 0.
local r = load(KEYS[2], ARGV[2])
if not r or r.tok ~= tonumber(ARGV[3]) then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', K_INDEX, ARGV[2])
return 1

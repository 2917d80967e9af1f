-- get = record.lua .. this.
-- KEYS[1]: the record. ARGV: now_ms|''. Reply: the live record, or nil. Writes nothing.
local now = now_ms(ARGV[1])
local r = load(KEYS[1])
if r == nil or r.exp <= now then
  return false
end
return reply('', r)

-- dead letters = record.lua .. inbox.lua .. this.
-- ARGV[3]: limit (>= 1). Reply: the oldest dead letters. Writes nothing.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[3]) - 1)) do
  local e = load_entry(id)
  if e then
    out[#out + 1] = entry_reply(e)
  end
end
return out

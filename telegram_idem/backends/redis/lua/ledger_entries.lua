-- ledger_entries = ledger_row.lua .. this.
-- ARGV: now_us|'' (unused), prefix, limit, state, state, ... Walks the index oldest first
-- (ties: by key, the zset's order of equal scores), in chunks, and keeps the rows whose
-- key starts with prefix (compared as bytes: no character is a pattern) and whose state
-- is listed, until limit. Reply: the rows, oldest first. Writes nothing.
local prefix, limit = ARGV[2], tonumber(ARGV[3])
local wanted = {}
for i = 4, #ARGV do
  wanted[ARGV[i]] = true
end
local CHUNK = 256
local out, at = {}, 0
while #out < limit do
  local keys = redis.call('ZRANGE', K_INDEX, at, at + CHUNK - 1)
  for _, key in ipairs(keys) do
    if string.sub(key, 1, #prefix) == prefix then
      local r = load(KEYS[2] .. key, key)
      if r and wanted[r.st] then
        out[#out + 1] = reply(r)
        if #out >= limit then
          break
        end
      end
    end
  end
  if #keys < CHUNK then
    break
  end
  at = at + CHUNK
end
return out

-- reserve = flood.lua .. this.
-- ARGV[2 + 2i - 1], ARGV[2 + 2i]: interval_us and burst of KEYS[i].
-- Reply: '0' (reserved in every budget) or the microseconds to wait (nothing written).
local wait = 0
local new = {}
for i, key in ipairs(KEYS) do
  local interval, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local nt = math.max(tat_of(key), now) + interval
  new[i] = nt
  wait = math.max(wait, nt - burst * interval - now)
end
if wait > 0 then
  return ufmt(math.ceil(wait))
end
for i, key in ipairs(KEYS) do
  store_tat(key, new[i])
end
return '0'

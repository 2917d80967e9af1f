-- gate (pause / paused_for) = flood.lua .. this.
-- ARGV[2]: 'pause' | 'paused_for'; ARGV[3]: seconds in microseconds (pause).
-- Reply: pause: '0'; paused_for: the microseconds the gate KEYS[1] stays closed.
local tat = tat_of(KEYS[1])
if ARGV[2] == 'pause' then
  local until_ = now + tonumber(ARGV[3])
  if until_ > tat then
    store_tat(KEYS[1], until_)
  end
  return '0'
end
return ufmt(math.max(tat - now, 0))

-- extend = record.lua .. this.
-- KEYS[1]: the record. ARGV: now_ms|'', token, lease_ms. Reply: 1 | 0.
local now = now_ms(ARGV[1])
local r = load(KEYS[1])
if not held(r, tonumber(ARGV[2]), now) then
  return 0
end
r.lease = now + tonumber(ARGV[3])
r.exp = math.max(r.exp, r.lease)
save(KEYS[1], r, now)
return 1

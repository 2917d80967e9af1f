-- release = record.lua .. this.
-- KEYS[1]: the record. ARGV: now_ms|'', token. Reply: 1 | 0.
-- The record stays (its token keeps fencing); the lease ends now, the fingerprint goes.
local now = now_ms(ARGV[1])
local r = load(KEYS[1])
if not held(r, tonumber(ARGV[2]), now) then
  return 0
end
r.lease = now
r.fp = false
save(KEYS[1], r, now)
return 1

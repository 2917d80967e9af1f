-- claim = record.lua .. decide_claim.lua .. this.
-- KEYS: the record keys (one slot on a cluster).
-- ARGV: now_ms|'', lease_ms, retention_ms, has_fp ('1'|'0'), fp.
-- Reply: one record reply per key, in KEYS order.
local now = now_ms(ARGV[1])
local lease = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local fp = false
if ARGV[4] == '1' then
  fp = ARGV[5]
end

local out = {}
for i, key in ipairs(KEYS) do
  local outcome, r, write, fresh = decide_claim(key, now, lease, retention, fp)
  if write then
    save(key, r, now, fresh)
  end
  out[i] = reply(outcome, r)
end
return out

-- guard = record.lua .. decide_claim.lua .. this: the update guard steps of a sharded
-- inbox's admission (telegram_idem/backends/redis/_inbox.py), on guard records only.
-- KEYS: the update guard records (one slot on a cluster).
-- ARGV[1]: now_ms|''; ARGV[2]: claim | admitted.
--   claim: ARGV[3] lease_ms (the admission's short lease), ARGV[4] retention_ms. The
--     claim decision on each key; reply per key {1, token, prev_token, takeover, exp_ms}
--     when acquired (prev_token: the token it replaced, 0 for none; takeover: 1 when it
--     took over a claim in progress whose lease had ended), else {0, 0, 0, 0, 0}.
--   admitted: ARGV[3] retention_ms, ARGV[4..] the token of each key. While the key is
--     held with that token: written completed with result null, lease and retention
--     retention_ms from now (exactly _inbox_logic.admitted_record); reply 1, else 0.
local now = now_ms(ARGV[1])
local op = ARGV[2]
local out = {}
if op == 'claim' then
  local lease, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
  for i, key in ipairs(KEYS) do
    local old = load(key)
    local outcome, r, write = decide_claim(key, now, lease, retention, false)
    if outcome == 'acquired' and write then
      save(key, r, now)
      local prev, takeover = 0, 0
      if old then
        prev = old.token
        if old.exp > now and old.status == 'in_progress' then
          takeover = 1
        end
      end
      out[i] = {1, r.token, prev, takeover, r.exp}
    else
      out[i] = {0, 0, 0, 0, 0}
    end
  end
  return out
elseif op == 'admitted' then
  local retention = tonumber(ARGV[3])
  for i, key in ipairs(KEYS) do
    local r = load(key)
    if held(r, tonumber(ARGV[3 + i]), now) then
      r.status = 'completed'
      r.result = 'null'
      r.exp = now + retention
      r.lease = now + retention
      save(key, r, now)
      out[i] = 1
    else
      out[i] = 0
    end
  end
  return out
end
return redis.error_reply('unknown inbox guard operation ' .. tostring(op))

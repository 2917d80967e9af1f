-- After record.lua: the claim decision, shared by claim.lua and inbox_admit.lua.
-- decide_claim(key, now, lease_ms, retention_ms, fp|false) -> outcome, record, write?,
-- fresh? (no hash was there: saving it deletes no field)
-- The claim table of machine.decide_claim; the caller saves the record when write is true
-- (the inbox's admission completes it first).
local function decide_claim(key, now, lease, retention, fp)
  local old = load(key)
  if old == nil or old.exp <= now then
    -- no record, or retention over: acquire (a remembered token still fences)
    local token = 1
    if old ~= nil then
      token = old.token + 1
    end
    return 'acquired', {status = 'in_progress', token = token, lease = now + lease,
                        exp = now + retention, fp = fp, result = false, attempts = 1}, true,
           old == nil
  end
  if fp and old.fp and old.fp ~= fp then
    return 'conflict', old, false
  end
  if old.status == 'completed' then
    return 'replay', old, false
  end
  if old.status == 'failed' then
    return 'failed', old, false
  end
  if old.lease > now then
    return 'in_progress', old, false
  end
  -- in progress, lease over (holder crashed, or released): takeover
  return 'acquired', {status = 'in_progress', token = old.token + 1, lease = now + lease,
                      exp = math.max(old.exp, now + retention), fp = fp or old.fp,
                      result = false, attempts = old.attempts + 1}, true
end

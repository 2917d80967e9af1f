-- After record.lua: the holder's last write, shared by complete.lua and fail.lua.
-- finish(key, status, now, token, result, retention_ms) -> 1 (done) | 0 (not held)
-- Only while the record is live, in progress and carries token: set the status, store
-- the bytes, keep the record retention_ms from now.
local function finish(key, status, now, token, result, retention)
  local r = load(key)
  if not held(r, token, now) then
    return 0
  end
  r.status = status
  r.result = result
  r.exp = now + retention
  save(key, r, now)
  return 1
end

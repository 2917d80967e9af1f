"""The Lua sources of :mod:`telegram_idem.backends.redis` (docs/design/record.md#the-record-and-its-state-machine in Lua).

Each script is the record state machine of :mod:`telegram_idem.machine`, run atomically
inside Redis, so one ``EVALSHA`` both reads and decides.

Record layout: one hash per key with the fields

=========  ===================================================================
status     ``in_progress`` | ``completed`` | ``failed``
token      fencing token (decimal integer)
lease      lease end, integer **milliseconds** since the epoch
exp        retention end, integer **milliseconds** since the epoch
fp         payload fingerprint (absent = none)
result     result or failure bytes (absent = none)
attempts   how many times the key was acquired
=========  ===================================================================

and a ``PEXPIRE`` of ``exp - now`` (at least 1 ms) set by every write, so Redis forgets
the record when its retention ends; a record whose ``exp`` has passed but which Redis
still holds counts as absent, except that its token still fences (new token = old + 1).

Common arguments: ``ARGV[1]`` is *now* in integer milliseconds since the epoch, or the
empty string to read the server's clock with ``TIME`` (allowed: Redis ≥ 5 replicates a
script's effects, not the script). Every duration argument is integer milliseconds.

Replies: a record is the array ``{outcome, status, token, lease_ms, exp_ms, fp|nil,
result|nil, attempts}``; token-checked writes answer ``1`` (done) or ``0`` (not held).
"""

from __future__ import annotations

__all__ = ["CLAIM", "CLAIM_FUNCTION", "COMPLETE", "EXTEND", "FAIL", "GET", "PRELUDE", "RELEASE"]

PRELUDE = r"""
local function fmt(n)
  return string.format('%d', n)
end

local function now_ms(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

local function load(key)
  local v = redis.call('HMGET', key, 'status', 'token', 'lease', 'exp', 'fp', 'result',
                       'attempts')
  if not v[1] then
    return nil
  end
  return {status = v[1], token = tonumber(v[2]), lease = tonumber(v[3]),
          exp = tonumber(v[4]), fp = v[5], result = v[6], attempts = tonumber(v[7])}
end

local function save(key, r, now)
  local set = {'status', r.status, 'token', fmt(r.token), 'lease', fmt(r.lease),
               'exp', fmt(r.exp), 'attempts', fmt(r.attempts)}
  local gone = {}
  if r.fp then
    set[#set + 1] = 'fp'
    set[#set + 1] = r.fp
  else
    gone[#gone + 1] = 'fp'
  end
  if r.result then
    set[#set + 1] = 'result'
    set[#set + 1] = r.result
  else
    gone[#gone + 1] = 'result'
  end
  redis.call('HSET', key, unpack(set))
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
  redis.call('PEXPIRE', key, fmt(math.max(r.exp - now, 1)))
end

local function reply(outcome, r)
  return {outcome, r.status, r.token, r.lease, r.exp, r.fp or false, r.result or false,
          r.attempts}
end

local function held(r, token, now)
  return r ~= nil and r.exp > now and r.status == 'in_progress' and r.token == token
end
"""

CLAIM_FUNCTION = r"""
-- decide_claim(key, now, lease_ms, retention_ms, fp|false) -> outcome, record, write?
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
                        exp = now + retention, fp = fp, result = false, attempts = 1}, true
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
"""
"""Lua: the claim decision as a function, shared by :data:`CLAIM` and the inbox's
admission script (:mod:`telegram_idem.backends.redis_inbox`). Needs :data:`PRELUDE`."""

CLAIM = (
    PRELUDE
    + CLAIM_FUNCTION
    + r"""
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
  local outcome, r, write = decide_claim(key, now, lease, retention, fp)
  if write then
    save(key, r, now)
  end
  out[i] = reply(outcome, r)
end
return out
"""
)

COMPLETE = (
    PRELUDE
    + r"""
-- KEYS[1]: the record. ARGV: now_ms|'', token, result, retention_ms. Reply: 1 | 0.
local now = now_ms(ARGV[1])
local r = load(KEYS[1])
if not held(r, tonumber(ARGV[2]), now) then
  return 0
end
r.status = 'completed'
r.result = ARGV[3]
r.exp = now + tonumber(ARGV[4])
save(KEYS[1], r, now)
return 1
"""
)

FAIL = COMPLETE.replace("r.status = 'completed'", "r.status = 'failed'").replace(
    "ARGV: now_ms|'', token, result,", "ARGV: now_ms|'', token, error,"
)
if "r.status = 'failed'" not in FAIL:  # pragma: no cover - guards an edit of COMPLETE
    raise RuntimeError("redis_scripts.FAIL no longer derives from COMPLETE")

RELEASE = (
    PRELUDE
    + r"""
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
"""
)

EXTEND = (
    PRELUDE
    + r"""
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
"""
)

GET = (
    PRELUDE
    + r"""
-- KEYS[1]: the record. ARGV: now_ms|''. Reply: the live record, or nil. Writes nothing.
local now = now_ms(ARGV[1])
local r = load(KEYS[1])
if r == nil or r.exp <= now then
  return false
end
return reply('', r)
"""
)

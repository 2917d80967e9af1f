-- The flood budget helpers every flood script starts with. Layout and the rule:
-- telegram_idem/backends/redis/_flood.py (telegram_idem.flood.decide, in microseconds).
-- KEYS: the budgets (one slot on a cluster). ARGV[1]: now_us|''.
local function now_us(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

local now = now_us(ARGV[1])

local function ufmt(n)
  return string.format('%d', n)
end

-- a budget's tat (microseconds), or now when no store holds it
local function tat_of(key)
  local v = redis.call('GET', key)
  if v then
    return tonumber(v)
  end
  return now
end

-- keep tat, forgotten a minute after it (a forgotten key is a full bucket)
local function store_tat(key, tat)
  redis.call('SET', key, ufmt(tat), 'PX', ufmt(math.max(math.ceil((tat - now) / 1000), 0) + 60000))
end

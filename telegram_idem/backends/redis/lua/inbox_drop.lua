-- drop = record.lua .. inbox.lua .. this.
-- ARGV[3]: id. Reply: 1, or 0 when it is not a dead letter. The update guard record is
-- not touched: a redelivery of the update stays a duplicate.
local id = ARGV[3]
local e = load_entry(id)
if e == nil or e.status ~= 'dead' then
  return 0
end
leave_marker(e)
redis.call('DEL', ekey(id))
redis.call('ZREM', K_DEAD, id)
mark(id, nil, 0)
return 1

-- complete = record.lua .. finish.lua .. this.
-- KEYS[1]: the record. ARGV: now_ms|'', token, result, retention_ms. Reply: 1 | 0.
return finish(KEYS[1], 'completed', now_ms(ARGV[1]), tonumber(ARGV[2]), ARGV[3],
              tonumber(ARGV[4]))

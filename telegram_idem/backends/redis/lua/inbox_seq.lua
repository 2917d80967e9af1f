-- seq: the store-wide admission counter of a sharded inbox (_inbox.py).
-- KEYS[1]: <key_prefix>:{<key_prefix>:inbox}:seq. ARGV[1]: how many seqs to reserve (>= 1).
-- Reply: the last one reserved (the reserved run ends there).
return redis.call('INCRBY', KEYS[1], ARGV[1])

-- now: the server's clock. KEYS[1] only routes the call (a cluster's node).
-- Reply: {seconds, microseconds} (TIME).
return redis.call('TIME')

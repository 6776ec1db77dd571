-- Read what Redis holds for one key, for an operator (the admin API): the
-- lock's fields and lease, and the record and its lease. It writes nothing.
-- KEYS[1] lock, KEYS[2] record
-- Returns {the lock's fields and values (HGETALL), its PTTL, the record or
-- false, its PTTL}.
return {
	redis.call('HGETALL', KEYS[1]),
	redis.call('PTTL', KEYS[1]),
	redis.call('GET', KEYS[2]),
	redis.call('PTTL', KEYS[2]),
}

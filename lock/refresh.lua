-- Extend the lease only if the lock still holds our token. PEXPIRE, not
-- HEXPIRE: the lock is a plain string key, not a hash field.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] lease in ms. Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

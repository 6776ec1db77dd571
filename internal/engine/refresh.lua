-- Extend the lease only if the lock still holds our token. PEXPIRE on the
-- lock key, not HEXPIRE: the lease belongs to the whole lock, not to the
-- token's hash field.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] lease in ms. Returns 1 or 0.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

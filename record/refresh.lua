-- Extend the lease of a lock and of its in-progress record, if the lock
-- still holds our token.
-- KEYS[1] lock, KEYS[2] record; ARGV[1] token, ARGV[2] lease in ms.
-- Returns 1, or 0 when the lock is not ours.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
	return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('GETRANGE', KEYS[2], 0, 0) == 'P' and redis.call('GETRANGE', KEYS[2], 65, -1) == ARGV[1] then
	redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1

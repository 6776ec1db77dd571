-- Give up a request without an outcome to keep (the backend was never
-- reached, or said "not processed, try again"): delete its in-progress
-- record, if still ours, and release the lock, so that a retry runs.
-- KEYS[1] lock, KEYS[2] record; ARGV[1] token.
-- Returns 1 when the lock was ours, else 0.
if redis.call('GETRANGE', KEYS[2], 0, 0) == 'P' and redis.call('GETRANGE', KEYS[2], 65, -1) == ARGV[1] then
	redis.call('DEL', KEYS[2])
end
return redis.call('HDEL', KEYS[1], ARGV[1])

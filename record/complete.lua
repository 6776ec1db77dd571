-- Complete a request: store its outcome for the retention time and release
-- the lock, in one step, so that a retry finds the outcome the moment the
-- lock is gone.
-- KEYS[1] lock, KEYS[2] record
-- ARGV[1] token, ARGV[2] retention in ms, ARGV[3] the completed record
-- Written when the in-progress record is ours, or when it is gone (its lease
-- ran out) and no other holder has taken the key since: a holder whose lease
-- ran out never overwrites a later holder's record.
-- Returns 1 when stored, 0 when not.
local state = redis.call('GETRANGE', KEYS[2], 0, 0)
local ours
if state == 'P' then
	ours = redis.call('GETRANGE', KEYS[2], 65, -1) == ARGV[1]
elseif state == '' then
	ours = redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
else
	ours = false
end
if ours then
	redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
redis.call('HDEL', KEYS[1], ARGV[1])
if ours then
	return 1
end
return 0

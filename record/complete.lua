-- Complete a request: store its outcome unless another request has taken
-- the key since (its lease ran out before this ran), and release what is
-- left of its lock. Checked here, where it runs: it may run long after it
-- was sent (Store.Complete).
-- KEYS[1] lock, KEYS[2] record
-- ARGV[1] token, ARGV[2] retention in ms, ARGV[3] the completed record
-- Returns 1 when the outcome is stored (now, or by an earlier try), 2 when
-- another holder has the lock (nothing written), else 0 (another outcome
-- is stored).
-- HEXISTS first: while the request holds its lock, as it mostly does, one
-- command tells.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
	return 2 -- another holder's: its outcome, not ours
end
local old = redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2], 'NX', 'GET')
-- Three fields deleted: the token, the fingerprint and the mark of a
-- request waiting (take.lua's mark_waited), which is woken. pcall: a user
-- not allowed to publish leaves waiters to their polling, not the record
-- unwritten.
if redis.call('HDEL', KEYS[1], ARGV[1], 'fp:' .. ARGV[1], 'w:' .. ARGV[1]) == 3 then
	redis.pcall('SPUBLISH', KEYS[1], '')
end
if not old or old == ARGV[3] then
	return 1
end
return 0

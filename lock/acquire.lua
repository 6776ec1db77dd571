-- Acquire a lock and issue its fencing token, in one round trip.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash slot)
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] counter lifetime in ms
-- Returns {1, fence} when the lock is ours, {0, pttl} when someone else holds it.
-- The uncontended path is three commands: SET NX, INCR, PEXPIRE.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	local fence = redis.call('INCR', KEYS[2])
	if fence == 1 then
		-- The counter expired or never existed: restart it from the server
		-- clock in microseconds, so tokens keep increasing across its expiry.
		-- Built as a string: Lua prints large numbers in float notation.
		local t = redis.call('TIME')
		fence = redis.call('INCRBY', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
	end
	redis.call('PEXPIRE', KEYS[2], ARGV[3])
	return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
	-- Our own acquire again (a retry whose first reply was lost): succeed
	-- without issuing a second fencing token.
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, redis.call('PTTL', KEYS[1])}

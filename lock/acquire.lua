-- Acquire a lock and issue its fencing token, in one round trip.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash slot)
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] counter lifetime in ms
-- Returns the fencing token as a decimal string when the lock is ours, the
-- holder's PTTL as an integer when it is not: the reply's type tells which,
-- with no table to build in Lua or to unpack in the client.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	-- The token is the server clock in microseconds, or one more than the
	-- last token when that is not below it (same microsecond, clock set
	-- back). So tokens strictly increase per key, also once the counter has
	-- expired. Three commands whether the counter exists or not: SET NX,
	-- TIME, SET GET (which stores the token and reads the last one at once).
	-- Tokens stay decimal strings, compared exactly, never Lua floats.
	local t = redis.call('TIME')
	local fence = t[1] .. string.format('%06d', tonumber(t[2]))
	local last = redis.call('SET', KEYS[2], fence, 'PX', ARGV[3], 'GET')
	if last and (#last > #fence or (#last == #fence and last >= fence)) then
		redis.call('SET', KEYS[2], last, 'PX', ARGV[3])
		redis.call('INCR', KEYS[2])
		return redis.call('GET', KEYS[2])
	end
	return fence
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
	-- Our own acquire again (a retry whose first reply was lost): succeed
	-- without issuing a second fencing token.
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return redis.call('GET', KEYS[2]) or '0'
end
return redis.call('PTTL', KEYS[1])

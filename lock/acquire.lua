-- Acquire a lock and issue its fencing token, in one round trip (the source
-- starts with take.lua).
-- KEYS[1] lock key, KEYS[2] fencing counter: the last token issued
-- ARGV[1] holder token, ARGV[2] lease in ms
-- Returns the fencing token as a decimal string when the lock is ours, the
-- holder's PTTL as an integer when it is not: the reply's type tells which,
-- with no table to build in Lua or to unpack in the client.
if redis.call('EXISTS', KEYS[1]) == 0 then
	return take(KEYS[1], ARGV[1], ARGV[2], KEYS[2])
end
local mine = redis.call('HGET', KEYS[1], ARGV[1])
if type(mine) == 'string' then
	-- Our own acquire again (a retry whose first reply was lost): succeed
	-- with the token issued the first time, never a second one.
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return mine
end
return redis.call('PTTL', KEYS[1])

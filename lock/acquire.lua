-- Acquire a lock and issue its fencing token, in one round trip.
-- KEYS[1] lock key: a hash whose one field is the holder's token, with the
--         fencing token as its value, so that release is a native
--         HDEL key token (no script: token-checked by construction)
-- KEYS[2] fencing high-water mark: the last token issued under the prefix
-- ARGV[1] holder token, ARGV[2] lease in ms
-- Returns the fencing token as a decimal string when the lock is ours, the
-- holder's PTTL as an integer when it is not: the reply's type tells which,
-- with no table to build in Lua or to unpack in the client.
if redis.call('EXISTS', KEYS[1]) == 0 then
	-- A script is not a transaction: a command that fails after HSET (an
	-- ACL user without PEXPIRE) would leave a lock with no TTL, held for
	-- ever. Check first (Redis 7+), and undo should PEXPIRE fail anyway.
	if redis.acl_check_cmd and not redis.acl_check_cmd('PEXPIRE', KEYS[1], ARGV[2]) then
		return redis.error_reply('NOPERM this user may not run PEXPIRE on the lock key')
	end
	-- The token is the server clock in microseconds, or one more than the
	-- last token issued when that is not below it (same microsecond, clock
	-- set back). One mark for all keys: tokens strictly increase per key
	-- (and across keys), and the locks leave nothing behind in Redis.
	-- SET GET stores the token and reads the last one in one command.
	-- Tokens stay decimal strings, compared exactly, never Lua floats.
	local t = redis.call('TIME')
	local fence = t[1] .. string.format('%06d', tonumber(t[2]))
	local last = redis.call('SET', KEYS[2], fence, 'GET')
	-- A counter that is not a plain decimal (written by hand) is ignored:
	-- it is overwritten by the clock's token instead of failing every
	-- acquire at INCR. The pattern runs only on this rare path.
	if last and (#last > #fence or (#last == #fence and last >= fence)) and
		#last <= 19 and last:match('^[1-9]%d*$') then
		redis.call('SET', KEYS[2], last)
		redis.call('INCR', KEYS[2])
		fence = redis.call('GET', KEYS[2])
	end
	redis.call('HSET', KEYS[1], ARGV[1], fence)
	local ok = redis.pcall('PEXPIRE', KEYS[1], ARGV[2])
	if type(ok) == 'table' and ok.err then
		redis.pcall('DEL', KEYS[1])
		return ok
	end
	return fence
end
local mine = redis.call('HGET', KEYS[1], ARGV[1])
if type(mine) == 'string' then
	-- Our own acquire again (a retry whose first reply was lost): succeed
	-- with the token issued the first time, never a second one.
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return mine
end
return redis.call('PTTL', KEYS[1])

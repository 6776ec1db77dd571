-- Shared by the scripts that take a lock (lock's acquire.lua, and record's
-- begin.lua, which takes one in the same step as its own work): the
-- script's source starts with this file.

-- clock is the server's clock in microseconds, as a decimal string. The
-- microseconds are padded with string.rep: string.format took a twelfth of
-- the acquire's Redis time (BenchmarkAcquireScript).
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- issue_fence returns the next fencing token of the counter: now, the server
-- clock, or one more than the last token issued when that is not below it
-- (same microsecond, clock set back). Tokens strictly increase per counter,
-- and stay decimal strings, compared exactly, never Lua floats. SET GET
-- stores the token and reads the last one in one command.
local function issue_fence(counter, now)
	local fence = now
	local last = redis.call('SET', counter, fence, 'GET')
	-- A counter that is not a plain decimal (written by hand) is ignored:
	-- it is overwritten by the clock's token instead of failing every
	-- acquire at INCR. The pattern runs only on this rare path.
	if last and (#last > #fence or (#last == #fence and last >= fence)) and
		#last <= 19 and last:match('^[1-9]%d*$') then
		redis.call('SET', counter, last)
		redis.call('INCR', counter)
		fence = redis.call('GET', counter)
	end
	return fence
end

-- take writes the lock (a hash whose field is the holder's token, with the
-- fencing token as its value, so that release is a native HDEL) with its
-- lease, and returns the fencing token, or an error reply having written
-- nothing that outlives its lease. field and value, when given, are one more
-- field the holder keeps in the lock (released with its token). A script is
-- not a transaction: a command that failed after HSET (an ACL user without
-- PEXPIRE) would leave a lock with no TTL, held for ever. So check first
-- (Redis 7+), and undo should PEXPIRE fail anyway.
local function take(lock, token, ttl, counter, now, field, value)
	if redis.acl_check_cmd and not redis.acl_check_cmd('PEXPIRE', lock, ttl) then
		return redis.error_reply('NOPERM this user may not run PEXPIRE on the lock key')
	end
	local fence = issue_fence(counter, now)
	if field then
		redis.call('HSET', lock, token, fence, field, value)
	else
		redis.call('HSET', lock, token, fence)
	end
	local ok = redis.pcall('PEXPIRE', lock, ttl)
	if type(ok) == 'table' and ok.err then
		redis.pcall('DEL', lock)
		return ok
	end
	return fence
end

-- acquire takes the lock for token when it is free (take), or, when token
-- holds it already (a retry whose first reply was lost), renews its lease
-- and returns the fencing token issued the first time, never a second one.
-- It returns nil when another holder has the lock, which the script answers
-- in its own way, and when gone exists: the caller gave token up after this
-- attempt failed to answer in time, and the give-back ran first (it went on
-- another connection while this script waited in a socket buffer, or in
-- the client's queue), so that the late attempt must take nothing. One
-- EXISTS of both keys keeps the free path's cost.
-- The mark lives a lease: an attempt held longer than that (a stalled
-- connection that delivers at the heal of a partition) would find neither
-- and take the key for a lease that nobody renews. So the caller also sends
-- the time after which it no longer waits for the answer, on this server's
-- clock (deadline, microseconds; '0' or nil: none), and an attempt that runs
-- later takes nothing, however late: the reply 'LATE <now>' also tells the
-- caller this server's clock.
local function acquire(lock, token, ttl, counter, gone, deadline, field, value)
	local now = clock()
	if deadline and deadline ~= '0' and (#now > #deadline or (#now == #deadline and now > deadline)) then
		return redis.error_reply('LATE ' .. now)
	end
	local found = redis.call('EXISTS', lock, gone)
	if found == 0 then
		return take(lock, token, ttl, counter, now, field, value)
	end
	if found == 2 or redis.call('EXISTS', gone) == 1 then
		return nil
	end
	local mine = redis.call('HGET', lock, token)
	if type(mine) == 'string' then
		redis.call('PEXPIRE', lock, ttl)
		return mine
	end
	return nil
end

-- mark_waited records in the lock that a request waits for it: the field
-- 'w:' .. holder, beside the holder's token. The holder's release deletes
-- it with its own fields, and publishes on the lock's sharded channel (the
-- lock key) when it was there, to wake the waiters; a lock nobody waits
-- for is released as before, with nothing published. Naming the holder
-- keeps the release's count of deleted fields unambiguous: a 'w:' field
-- exists only while its holder's token does (both go in one HDEL, or with
-- the key).
local function mark_waited(lock)
	local fields = redis.call('HKEYS', lock)
	for i = 1, #fields do
		if not string.find(fields[i], ':', 1, true) then
			redis.call('HSET', lock, 'w:' .. fields[i], '1')
			return
		end
	end
end

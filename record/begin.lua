-- Begin a request under an idempotency key (the source starts with
-- internal/redisscript's take.lua): its stored outcome, or its lock and its
-- record in progress, in one round trip.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] record, KEYS[4] the holder
-- token's give-back mark (lock.GoneKey)
-- ARGV[1] holder token, ARGV[2] lease in ms, ARGV[3] fingerprint (64 hex),
-- ARGV[4] the caller's deadline on this server's clock in microseconds, '0'
-- for none (acquire, in take.lua), ARGV[5] retention in ms, ARGV[6] '1'
-- when the caller waits and listens for the release (mark_waited, in
-- take.lua)
-- The record exists from the begin, for the retention: 'P' .. fingerprint
-- .. token while its request runs, 'C' .. fingerprint .. response once it
-- completed. A 'P' record whose lock is gone belongs to a holder whose
-- lease ran out before it completed or gave the record back: its request
-- may have run, so nobody takes the key. The first begin to find it so
-- appends '@' and a deadline a lease away (server clock, microseconds),
-- and until then the key is answered as in progress: a holder that is
-- late (its give-back or its answer on the way through a failover or a
-- healing partition) lands first. After it the record is abandoned.
-- Returns: the fencing token (a decimal string) when the request is ours to
-- run; the holder's PTTL, or what is left before the record is abandoned
-- (an integer), while another runs it; 'M' when the key is in use by a
-- request with another fingerprint; 'A' when its record is abandoned; the
-- completed record ('C...').
local head = redis.call('GETRANGE', KEYS[3], 0, 127)
if head ~= '' then
	if string.sub(head, 2, 65) ~= ARGV[3] then
		return 'M'
	end
	if string.sub(head, 1, 1) == 'C' then
		return redis.call('GET', KEYS[3])
	end
	if redis.call('EXISTS', KEYS[1]) == 0 then
		local now = tonumber(clock())
		local mark = string.sub(head, 103)
		if mark == '' then
			redis.call('SETRANGE', KEYS[3], 101, '@' .. string.format('%d', now + ARGV[2] * 1000))
			return tonumber(ARGV[2])
		end
		local left = tonumber(mark) - now
		if left > 0 then
			return math.floor(left / 1000)
		end
		return 'A'
	end
	-- Our own begin again (a retry whose reply was lost) succeeds with the
	-- token issued the first time (acquire, in take.lua).
	local fence = acquire(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[4], ARGV[4])
	if fence then
		return fence
	end
else
	local fence = acquire(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[4], ARGV[4])
	if fence then
		if type(fence) == 'string' then
			redis.call('SET', KEYS[3], 'P' .. ARGV[3] .. ARGV[1], 'PX', ARGV[5])
		end
		return fence
	end
end
if ARGV[6] == '1' then
	mark_waited(KEYS[1])
end
return redis.call('PTTL', KEYS[1])

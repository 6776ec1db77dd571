-- Begin a request under an idempotency key (the source starts with lock's
-- take.lua): its stored outcome, or its lock and an in-progress record, in
-- one round trip.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] record
-- ARGV[1] holder token, ARGV[2] lease in ms, ARGV[3] fingerprint (64 hex)
-- A record is 'P' .. fingerprint .. owner token while in progress, and
-- 'C' .. fingerprint .. response once completed.
-- Returns: the fencing token (a decimal string) when the request is ours to
-- run; the holder's PTTL (an integer) while another runs it; 'M' when the
-- key's record has another fingerprint; the completed record ('C...').
local head = redis.call('GETRANGE', KEYS[3], 0, 64)
if head ~= '' then
	if string.sub(head, 2) ~= ARGV[3] then
		return 'M'
	end
	if string.sub(head, 1, 1) == 'C' then
		return redis.call('GET', KEYS[3])
	end
	if redis.call('GETRANGE', KEYS[3], 65, -1) ~= ARGV[1] then
		return redis.call('PTTL', KEYS[3])
	end
	-- Our own begin again (a retry whose reply was lost): go on below.
end
local record = 'P' .. ARGV[3] .. ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then
	local fence = take(KEYS[1], ARGV[1], ARGV[2], KEYS[2])
	if type(fence) == 'table' then
		return fence -- an error reply; take wrote nothing that lasts
	end
	-- SET with PX writes the record and its lease in one command.
	local ok = redis.pcall('SET', KEYS[3], record, 'PX', ARGV[2])
	if type(ok) == 'table' and ok.err then
		redis.pcall('DEL', KEYS[1])
		return ok
	end
	return fence
end
local mine = redis.call('HGET', KEYS[1], ARGV[1])
if type(mine) == 'string' then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	redis.call('SET', KEYS[3], record, 'PX', ARGV[2])
	return mine
end
return redis.call('PTTL', KEYS[1])

-- Begin a request under an idempotency key (the source starts with
-- internal/redisscript's take.lua): its stored outcome, or its lock, in one
-- round trip.
-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] record, KEYS[4] the holder
-- token's give-back mark (lock.GoneKey)
-- ARGV[1] holder token, ARGV[2] lease in ms, ARGV[3] fingerprint (64 hex),
-- ARGV[4] the caller's deadline on this server's clock in microseconds, '0'
-- for none (acquire, in take.lua), ARGV[5] '1' when the caller waits and
-- listens for the release (mark_waited, in take.lua)
-- While the request runs, its fingerprint is a field of the lock beside the
-- holder's token ("fp:" .. token), kept and released with it. The record
-- exists once the request completed: 'C' .. fingerprint .. response.
-- Returns: the fencing token (a decimal string) when the request is ours to
-- run; the holder's PTTL (an integer) while another runs it; 'M' when the
-- key is in use by a request with another fingerprint; the completed record
-- ('C...').
local head = redis.call('GETRANGE', KEYS[3], 0, 64)
if head ~= '' then
	if string.sub(head, 2) ~= ARGV[3] then
		return 'M'
	end
	return redis.call('GET', KEYS[3])
end
-- Our own begin again (a retry whose reply was lost) succeeds with the
-- token issued the first time (acquire, in take.lua).
local fence = acquire(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[4], ARGV[4], 'fp:' .. ARGV[1], ARGV[3])
if fence then
	return fence
end
-- Another request holds the key: the same one (409) or another (422).
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
	if string.sub(fields[i], 1, 3) == 'fp:' and fields[i + 1] ~= ARGV[3] then
		return 'M'
	end
end
if ARGV[5] == '1' then
	mark_waited(KEYS[1])
end
return redis.call('PTTL', KEYS[1])

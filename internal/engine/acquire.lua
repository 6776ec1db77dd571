-- Acquire a lock and issue its fencing token, in one round trip (the source
-- starts with internal/redisscript's take.lua).
-- KEYS[1] lock key, KEYS[2] fencing counter: the last token issued,
-- KEYS[3] the holder token's give-back mark (GoneKey)
-- ARGV[1] holder token, ARGV[2] lease in ms, ARGV[3] the caller's deadline
-- on this server's clock in microseconds, '0' for none (acquire, in
-- take.lua), ARGV[4] '1' when the caller waits for the lock and listens for
-- its release (mark_waited, in take.lua)
-- Returns the fencing token as a decimal string when the lock is ours, the
-- holder's PTTL as an integer when it is not: the reply's type tells which,
-- with no table to build in Lua or to unpack in the client.
-- A retry of our own acquire (its first reply lost) succeeds with the token
-- issued the first time (acquire, in take.lua).
local fence = acquire(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[3], ARGV[3])
if fence then
	return fence
end
if ARGV[4] == '1' then
	mark_waited(KEYS[1])
end
return redis.call('PTTL', KEYS[1])

-- Give a request up with nothing to keep (Pending.Release: the backend was
-- never reached, or answered "try again"; or a begin that did not answer in
-- time, which may still run): its record in progress deleted, so that a
-- retry runs, and its lock released. Only the holder's own: a record of
-- another token's, or completed, stays.
-- KEYS[1] lock, KEYS[2] record, KEYS[3] the token's give-back mark
-- (lock.GoneKey), for a begin that may still run (its acquire then takes
-- nothing), else absent
-- ARGV[1] token, ARGV[2] the mark's lifetime in ms (with KEYS[3])
-- Returns 1 when anything of the holder's was deleted, else 0.
if KEYS[3] then
	redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
local deleted = 0
local head = redis.call('GETRANGE', KEYS[2], 0, 100)
if string.sub(head, 1, 1) == 'P' and string.sub(head, 66, 101) == ARGV[1] then
	deleted = redis.call('DEL', KEYS[2])
end
-- The token's field and the mark of a request waiting (take.lua's
-- mark_waited), which is woken.
local n = redis.call('HDEL', KEYS[1], ARGV[1], 'w:' .. ARGV[1])
if n == 2 then
	redis.pcall('SPUBLISH', KEYS[1], '')
end
if n > 0 then
	deleted = 1
end
return deleted

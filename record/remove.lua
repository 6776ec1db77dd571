-- Remove a key's record, so that the next request with the key runs (the
-- admin API, clearing an outcome-unknown record), unless its lock is held:
-- a held lock is a request in progress, and is never touched.
-- KEYS[1] lock, KEYS[2] record
-- Returns 'H' when the lock is held (nothing deleted), '' when there is no
-- record, else the head of the record deleted ('C', fingerprint, version,
-- outcome, status: what decodeHead reads).
if redis.call('EXISTS', KEYS[1]) == 1 then
	return 'H'
end
local head = redis.call('GETRANGE', KEYS[2], 0, 68)
if head ~= '' then
	redis.call('DEL', KEYS[2])
end
return head

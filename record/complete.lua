-- Complete a request: store its outcome in its record, unless the record
-- is no longer its own, and release what is left of its lock. Checked here,
-- where it runs: it may run long after it was sent (Store.Complete).
-- KEYS[1] lock, KEYS[2] record
-- ARGV[1] token, ARGV[2] retention in ms, ARGV[3] the completed record,
-- ARGV[4] '1' when the caller holds the key on a majority of Redlock's
-- masters: its outcome replaces another holder's record in progress on
-- this one (a competing begin that took this master and no majority)
-- Returns 1 when the outcome is stored (now, or by an earlier try), 2 when
-- another holder has the key (nothing written), else 0 (another outcome is
-- stored, or another holder's record is there).
-- The record is ours while it is in progress under our token ('P' ..
-- fingerprint .. token, begin.lua), also once our lease ran out: nobody
-- else begins a request over it (it is abandoned), so the real outcome
-- replaces it, however late.
local head = redis.call('GETRANGE', KEYS[2], 0, 100)
local kind = string.sub(head, 1, 1)
local stored = 1
if kind == 'C' then
	-- A try again of ours after a lost reply finds its own outcome.
	if redis.call('GET', KEYS[2]) ~= ARGV[3] then
		stored = 0
	end
elseif not (kind == 'P' and string.sub(head, 66, 101) == ARGV[1]) and ARGV[4] ~= '1' then
	if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
		return 2 -- another holder's: its outcome, not ours
	end
	if kind == 'P' then
		return 0 -- another holder's record, its lock gone: abandoned
	end
	-- No record: removed by an operator, or begun by an earlier version.
end
if kind ~= 'C' then
	redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
-- The token's field and the mark of a request waiting (take.lua's
-- mark_waited), which is woken. pcall: a user not allowed to publish
-- leaves waiters to their polling, not the record unwritten.
if redis.call('HDEL', KEYS[1], ARGV[1], 'w:' .. ARGV[1]) == 2 then
	redis.pcall('SPUBLISH', KEYS[1], '')
end
return stored

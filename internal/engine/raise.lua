-- Raise a fencing counter to a token issued elsewhere (the winner of a
-- Redlock majority), unless it is already at or above it.
-- KEYS[1] counter; ARGV[1] token (decimal). Returns 1.
-- Tokens are compared as decimal strings, never Lua floats; a counter that
-- is not a plain decimal is overwritten.
local last = redis.call('GET', KEYS[1])
local t = ARGV[1]
if not last or not last:match('^[1-9]%d*$') or #last < #t or (#last == #t and last < t) then
	redis.call('SET', KEYS[1], t)
end
return 1

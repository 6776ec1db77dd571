-- wrk script: a distinct Idempotency-Key on every request, from the run's
-- nonce (first script argument), the thread number and a counter.
local threads = 0

function setup(thread)
	thread:set("tid", threads)
	threads = threads + 1
end

function init(args)
	nonce = args[1] or tostring(os.time())
	prefix = "lt-" .. nonce .. "-" .. tid .. "-"
	counter = 0
	headers = {}
	for k, v in pairs(wrk.headers) do
		headers[k] = v
	end
end

function request()
	counter = counter + 1
	headers["Idempotency-Key"] = prefix .. counter
	return wrk.format(nil, nil, headers)
end

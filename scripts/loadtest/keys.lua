-- wrk script: a POST of a small JSON charge, as a payment API receives it
-- (the same body as bench/latency's), with an Idempotency-Key on every
-- request, from the run's nonce (first script argument), the thread number
-- and a counter.
--
-- With a second argument N, each thread cycles through its own N keys
-- (counter 1..N, then 1 again) instead of counting on: the same nonce and N
-- in two runs send the same keys, so a first run stores their answers and
-- every request of the next one is a retry of a stored key. Each thread has
-- keys of its own, and a key comes back only after N requests of its
-- thread, long after its previous request has finished.
local threads = 0

function setup(thread)
	thread:set("tid", threads)
	threads = threads + 1
end

function init(args)
	nonce = args[1] or tostring(os.time())
	cycle = tonumber(args[2] or "") or 0
	prefix = "lt-" .. nonce .. "-" .. tid .. "-"
	counter = 0
	headers = {}
	for k, v in pairs(wrk.headers) do
		headers[k] = v
	end
	headers["Content-Type"] = "application/json"
	body = '{"amount":1299,"currency":"eur"}'
end

function request()
	counter = counter + 1
	if cycle > 0 and counter > cycle then
		counter = 1
	end
	headers["Idempotency-Key"] = prefix .. counter
	return wrk.format("POST", nil, headers, body)
end

package redislock

import "strings"

// A result is what the handler did with a request: the value of
// {http.redis_lock.result} and of the result label of
// caddy_redis_lock_requests_total.
const (
	resultAcquired    = "acquired"
	resultConflict    = "conflict"
	resultBypassed    = "bypassed"
	resultFailOpen    = "fail_open"
	resultRejected    = "rejected"
	resultUnavailable = "unavailable"
	resultLost        = "lost"
	resultCancelled   = "cancelled"
	resultGaveUp      = "gave_up"
	resultTooEarly    = "too_early"
	resultReplayed    = "replayed"
	resultMismatch    = "mismatch"
	resultAbandoned   = "abandoned"
)

// results is the one list of results with their meanings: the metric's help
// text and its series are made from it, and a test checks that
// docs/reference.md documents exactly these.
var results = []struct{ name, meaning string }{
	{resultAcquired, "lock held, request passed on"},
	{resultConflict, "409: another request holds the lock"},
	{resultBypassed, "key missing with missing_key pass: passed on unlocked"},
	{resultFailOpen, "Redis unavailable with on_error fail_open: passed on unlocked"},
	{resultRejected, "400, 408 or 413: key missing, ambiguous or invalid, body not JSON, too large or unreadable"},
	{resultUnavailable, "503: Redis unavailable"},
	{resultLost, "the lock was lost while the request was in flight"},
	{resultCancelled, "the client went away first"},
	{resultGaveUp, "the client went away and the backend had not answered a lease later: upstream request cancelled"},
	{resultTooEarly, "425: TLS early data"},
	{resultReplayed, "idempotency: answered from the stored response"},
	{resultMismatch, "idempotency: 422, the key was used for another request"},
	{resultAbandoned, "idempotency: 502 outcome-unknown, the key's record was left unfinished by its holder (its node died, or was cut off from Redis past its lease)"},
}

// resultNames lists the results' names, in order.
func resultNames() []string {
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.name
	}
	return names
}

// resultsHelp is the help text of caddy_redis_lock_requests_total.
func resultsHelp() string {
	return "Requests seen by redis_lock, by result (" + strings.Join(resultNames(), ", ") + ")."
}

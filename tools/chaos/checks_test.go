package main

import (
	"fmt"
	"testing"
	"time"
)

// Each check on records made up to break exactly it: every check can fail,
// and the documented windows excuse what they document and no more.

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }

func ex(id string, fence int64, start, end int) execution {
	return execution{ID: id, Key: "k", Fence: fence, FenceRaw: fmt.Sprint(fence), Start: ms(start), End: ms(end),
		Status: 200, Body: []byte(`{"execution_id":"` + id + `"}`)}
}

// answer is a client's attempt that got e's answer (replayed or not).
func answer(client int, e execution, replayed bool, start, end int) attempt {
	return attempt{Key: "k", Client: client, Patient: true, Start: ms(start), End: ms(end),
		Status: e.Status, Body: e.Body, ExecID: e.ID, Replayed: replayed}
}

// acctAnswer is a client's attempt of e's key that got e's answer.
func acctAnswer(client int, e execution, end int) attempt {
	a := answer(client, e, false, 0, end)
	a.Key = e.Key
	return a
}

// clients are one attempt each, each client with a definite answer in the
// end (its other attempts left out).
func clients(as ...attempt) []clientResult {
	var cs []clientResult
	for _, a := range as {
		cs = append(cs, clientResult{Key: a.Key, Client: a.Client, Attempts: []attempt{a}, Definite: true})
	}
	return cs
}

func stored(keys ...string) redisState {
	st := redisState{Records: map[string]bool{}}
	for _, k := range keys {
		st.Records[recordKeyOf(k)] = true
	}
	return st
}

// acctEx is an execution of key within account: its key as the backend
// records it, and the executions of the account in progress as it began.
func acctEx(id, account, key string, fence int64, start, end int, concurrent ...string) execution {
	e := ex(id, fence, start, end)
	e.Account, e.Key, e.Concurrent = account, accountKey(account, key), concurrent
	return e
}

func count(vs []violation) map[string]int {
	m := map[string]int{}
	for _, v := range vs {
		m[v.Check]++
	}
	return m
}

func TestChecks(t *testing.T) {
	e1 := ex("ex_1", 10, 0, 100)
	e2 := ex("ex_2", 20, 300, 400)
	e503 := ex("ex_1", 10, 0, 100)
	e503.Status = 503
	outage := faultEvent{Kind: redisPause, Start: ms(50), Return: ms(250)}
	empty := faultEvent{Kind: redisRestartEmpty, Start: ms(150), Return: ms(200)}
	bad := answer(1, e1, true, 200, 210)
	bad.Body = []byte(`{"execution_id":"ex_1","x":1}`)
	slow := answer(0, e1, false, 0, 100)
	slow.End = ms(100).Add(attemptBound(time.Second, 0))
	cut := faultEvent{Kind: netRedisPartition, Nodes: []int{0, 2}, Start: ms(50), Back: ms(240), Return: ms(250)}
	fromNode := func(a attempt, node int) attempt { a.Node = node; return a }
	gaveUp := clientResult{Key: "k", Client: 2, Attempts: []attempt{{Key: "k", Client: 2, Status: 409, Start: ms(10), End: ms(20)}}}
	kill := faultEvent{Kind: nodeKill, Node: 1, Start: ms(50), Return: ms(1050)}
	dying := ex("ex_1", 10, 0, 100) // node 1's, killed at 50ms: its answer never reached the node
	dying.Node, dying.WriteErr = 1, "broken pipe"
	dying503 := dying
	dying503.Status = 503
	killedAttempt := attempt{Key: "k", Node: 1, Start: ms(0), End: ms(50), Err: "EOF"}
	abandonedAtEnd := redisState{Records: map[string]bool{}, Abandoned: []string{recordKeyOf("k")}}

	tests := []struct {
		name    string
		rec     runRecord
		want    map[string]int
		excused int // re-runs and overlaps a window excused
	}{
		{name: "clean: one run, its answer and a replay",
			rec:  runRecord{Execs: []execution{e1}, Clients: clients(answer(0, e1, false, 0, 101), answer(1, e1, true, 200, 210)), End: stored("k")},
			want: map[string]int{}},
		{name: "a replay that is not the bytes it names",
			rec:  runRecord{Execs: []execution{e1}, Clients: clients(answer(0, e1, false, 0, 101), bad), End: stored("k")},
			want: map[string]int{checkReplayBytes: 1}},
		{name: "a replay of an execution that never ran",
			rec:  runRecord{Execs: []execution{e1}, Clients: clients(answer(0, e1, false, 0, 101), answer(1, e2, true, 500, 510)), End: stored("k")},
			want: map[string]int{checkReplayBytes: 1}},
		{name: "two runs at once",
			rec:  runRecord{Execs: []execution{e1, ex("ex_2", 20, 50, 150)}, End: stored()},
			want: map[string]int{checkOverlap: 1}},
		{name: "two runs at once across an empty restart",
			rec:  runRecord{Execs: []execution{ex("ex_1", 10, 100, 300), ex("ex_2", 20, 210, 320)}, Faults: []faultEvent{empty}},
			want: map[string]int{}, excused: 1},
		{name: "a fencing token not above the one before",
			rec:  runRecord{Execs: []execution{e1, ex("ex_2", 10, 300, 400)}},
			want: map[string]int{checkFencing: 1}},
		{name: "no fencing token",
			rec:  runRecord{Execs: []execution{ex("ex_1", 0, 0, 100)}},
			want: map[string]int{checkFencing: 1}},
		{name: "a run after the answer was delivered",
			rec:  runRecord{Execs: []execution{e1, e2}, Clients: clients(answer(0, e1, false, 0, 101)), End: stored("k"), Idempotency: true},
			want: map[string]int{checkRerun: 1}},
		{name: "a run after a replay",
			rec:  runRecord{Execs: []execution{e1, e2}, Clients: clients(answer(1, e1, true, 200, 210)), End: stored("k")},
			want: map[string]int{checkRerun: 1}},
		{name: "a run after outcome-unknown",
			rec: runRecord{Execs: []execution{e1, e2}, Clients: clients(attempt{Key: "k", Status: 502, Problem: "outcome-unknown",
				Start: ms(0), End: ms(120)})},
			want: map[string]int{checkRerun: 1}},
		{name: "idempotency: a run after one that died with its node",
			rec:  runRecord{Execs: []execution{dying, e2}, Faults: []faultEvent{kill}, Idempotency: true},
			want: map[string]int{checkDeath: 1}},
		{name: "lock only: a run after one that died with its node is the documented limit",
			rec:  runRecord{Execs: []execution{dying, e2}, Faults: []faultEvent{kill}},
			want: map[string]int{}},
		{name: "a run after one that died with its node, past the backend's not-processed 503",
			rec:  runRecord{Execs: []execution{dying503, e2}, Faults: []faultEvent{kill}, Idempotency: true},
			want: map[string]int{}},
		{name: "a run after one that died with its node, its record lost in an empty restart",
			rec: runRecord{Execs: []execution{dying, e2}, Faults: []faultEvent{kill, empty}, Idempotency: true,
				End: redisState{Records: map[string]bool{}}},
			want: map[string]int{}, excused: 1},
		{name: "a run of another node's after one whose node lived",
			rec:  runRecord{Execs: []execution{e1, e2}, Faults: []faultEvent{kill}, Idempotency: true},
			want: map[string]int{}},
		{name: "an abandoned record at the end, under a node killed mid-request",
			rec:  runRecord{Execs: []execution{dying}, Clients: []clientResult{{Key: "k", Attempts: []attempt{killedAttempt}, Definite: true}}, Faults: []faultEvent{kill}, End: abandonedAtEnd},
			want: map[string]int{}},
		{name: "outcome-unknown answered from a record abandoned at the end, under a node killed after the key reached it",
			rec: runRecord{Clients: []clientResult{{Key: "k", Attempts: []attempt{{Key: "k", Node: 1, Start: ms(0), End: ms(20), Err: "timeout"},
				{Key: "k", Node: 0, Status: 502, Problem: "outcome-unknown", Replayed: true, Start: ms(3000), End: ms(3010)}}, Definite: true}},
				Faults: []faultEvent{kill}, Idempotency: true, End: abandonedAtEnd},
			want: map[string]int{}},
		{name: "outcome-unknown from a record abandoned, given back later by its holder: no record, nothing ran",
			rec: runRecord{Clients: clients(attempt{Key: "k", Status: 502, Problem: "outcome-unknown", Replayed: true, Start: ms(0), End: ms(20)}),
				Idempotency: true, End: stored()},
			want: map[string]int{}},
		{name: "outcome-unknown after a run, and no record at the end",
			rec: runRecord{Execs: []execution{e1}, Clients: clients(attempt{Key: "k", Status: 502, Problem: "outcome-unknown", Replayed: true, Start: ms(200), End: ms(220)}),
				Idempotency: true, End: stored()},
			want: map[string]int{checkLeftovers: 1}},
		{name: "an abandoned record at the end, no node killed",
			rec:  runRecord{Execs: []execution{e1}, Clients: clients(answer(0, e1, false, 0, 101)), End: abandonedAtEnd},
			want: map[string]int{checkLeftovers: 1}},
		{name: "a first run after an abandoned record's outcome-unknown (given back later: nothing had run)",
			rec: runRecord{Execs: []execution{e2}, Clients: clients(attempt{Key: "k", Status: 502, Problem: "outcome-unknown", Replayed: true,
				Start: ms(0), End: ms(120)}), Idempotency: true, End: stored("k")},
			want: map[string]int{}},
		{name: "a run after a not-processed 503 is a retry",
			rec:  runRecord{Execs: []execution{e503, e2}, Clients: clients(answer(0, e503, false, 0, 120))},
			want: map[string]int{}},
		{name: "a replay of a not-processed 503",
			rec:  runRecord{Execs: []execution{e503}, Clients: clients(answer(0, e503, true, 200, 220))},
			want: map[string]int{checkReplayBytes: 1}},
		{name: "answered while Redis was away, run again within a try's interval of its return",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 260, 400)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond},
			want: map[string]int{}, excused: 1},
		{name: "answered while Redis was away, run again as it came back, before the restart returned",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 245, 400)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{{Kind: redisKillAOF, Start: ms(50), Back: ms(240), Return: ms(250)}}, Timeout: 100 * time.Millisecond},
			want: map[string]int{}, excused: 1},
		{name: "answered while Redis was away, run again before it came back",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 235, 400)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{{Kind: redisKillAOF, Start: ms(50), Back: ms(240), Return: ms(250)}}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered while Redis was away, run again after two timeouts and a try's pause",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 600, 700)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered while Redis was away, run again later",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 800, 900)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered before Redis went away, run again at its return",
			rec: runRecord{Execs: []execution{ex("ex_1", 10, 0, 30), ex("ex_2", 20, 260, 400)}, Clients: clients(answer(0, ex("ex_1", 10, 0, 30), false, 0, 40)),
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered by a node cut off from Redis, run again on another during the cut",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 200, 400)}, Clients: clients(fromNode(answer(0, e1, false, 0, 101), 2)),
				Faults: []faultEvent{cut}, Timeout: 100 * time.Millisecond},
			want: map[string]int{}, excused: 1},
		{name: "answered by a node cut off from Redis, run again within a try's interval of the heal",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 500, 600)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{cut}, Timeout: 100 * time.Millisecond},
			want: map[string]int{}, excused: 1},
		{name: "answered by a node cut off from Redis, run again later",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 600, 700)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{cut}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered by a node that still reached Redis, run again during a cut of others",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 200, 400)}, Clients: clients(fromNode(answer(0, e1, false, 0, 101), 1)),
				Faults: []faultEvent{cut}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered by a cut-off node before the cut, run again during it",
			rec: runRecord{Execs: []execution{ex("ex_1", 10, 0, 30), ex("ex_2", 20, 200, 400)}, Clients: clients(answer(0, ex("ex_1", 10, 0, 30), false, 0, 40)),
				Faults: []faultEvent{cut}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered while every node's link was held, run again at the heal",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 245, 400)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{{Kind: netRedisHold, Nodes: []int{0, 1, 2}, Start: ms(50), Back: ms(240), Return: ms(250)}}, Timeout: 100 * time.Millisecond},
			want: map[string]int{}, excused: 1},
		{name: "answered during a slow link, run again: no window",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 245, 400)}, Clients: clients(answer(0, e1, false, 0, 101)),
				Faults: []faultEvent{{Kind: netRedisSlow, Nodes: []int{0, 1, 2}, Start: ms(50), Back: ms(240), Return: ms(250)}}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkRerun: 1}},
		{name: "answered, Redis restarted empty, run again",
			rec:     runRecord{Execs: []execution{e1, e2}, Clients: clients(answer(0, e1, false, 0, 101)), Faults: []faultEvent{empty}, TTL: time.Second},
			want:    map[string]int{},
			excused: 1},
		{name: "an account: two keys one after the other, the same key in another account at once",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 10, 0, 100), acctEx("ex_2", "a", "k2", 20, 150, 250),
				acctEx("ex_3", "b", "k1", 15, 50, 200)}},
			want: map[string]int{}},
		{name: "two requests of an account at once",
			rec:  runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 10, 0, 100), acctEx("ex_2", "a", "k2", 20, 50, 150, "ex_1")}},
			want: map[string]int{checkAccount: 1}},
		{name: "two requests of an account at once across an empty restart",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 10, 100, 300), acctEx("ex_2", "a", "k2", 20, 210, 320, "ex_1")},
				Faults: []faultEvent{empty}},
			want: map[string]int{}, excused: 1},
		{name: "two requests of an account at once, the first begun after an empty restart",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 10, 250, 400), acctEx("ex_2", "a", "k2", 20, 300, 450, "ex_1")},
				Faults: []faultEvent{empty}},
			want: map[string]int{checkAccount: 1}},
		{name: "two requests of an account at once across a Redis outage: no window",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 10, 0, 300), acctEx("ex_2", "a", "k2", 20, 260, 400, "ex_1")},
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond},
			want: map[string]int{checkAccount: 1}},
		{name: "an account's fencing token not above its execution before's, another key",
			rec:  runRecord{Execs: []execution{acctEx("ex_1", "a", "k1", 20, 0, 100), acctEx("ex_2", "a", "k2", 10, 150, 250)}},
			want: map[string]int{checkFencing: 1}},
		{name: "answers of the same key in two accounts, each with its record",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k", 10, 0, 100), acctEx("ex_2", "b", "k", 20, 0, 100)},
				Clients: clients(acctAnswer(0, acctEx("ex_1", "a", "k", 10, 0, 100), 101), acctAnswer(1, acctEx("ex_2", "b", "k", 20, 0, 100), 101)),
				End:     stored("a/k", "b/k"), Idempotency: true},
			want: map[string]int{}},
		{name: "an answer in an account, its record stored outside it",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k", 10, 0, 100)},
				Clients: clients(acctAnswer(0, acctEx("ex_1", "a", "k", 10, 0, 100), 101)), End: stored("k"), Idempotency: true},
			want: map[string]int{checkLeftovers: 1}},
		{name: "an answer of another account's execution",
			rec: runRecord{Execs: []execution{acctEx("ex_1", "a", "k", 10, 0, 100), acctEx("ex_2", "b", "k", 20, 0, 100)},
				Clients: clients(acctAnswer(0, acctEx("ex_1", "a", "k", 10, 0, 100), 101), acctAnswer(1, acctEx("ex_1", "b", "k", 10, 0, 100), 150)),
				End:     stored("a/k", "b/k")},
			want: map[string]int{checkReplayBytes: 1}},
		{name: "a 422 key-reused",
			rec:  runRecord{Clients: clients(attempt{Key: "b/k", Status: 422, Problem: "key-reused", Start: ms(0), End: ms(10)})},
			want: map[string]int{checkKeyReused: 1}},
		{name: "a patient attempt past the bound, a client with no definite answer",
			rec:  runRecord{Execs: []execution{e1}, Clients: append(clients(slow), gaveUp), TTL: time.Second},
			want: map[string]int{checkBounded: 2}},
		{name: "a lock and an in-progress record left",
			rec:  runRecord{End: redisState{Locks: []string{"chaos:{abcd}x"}, InProgress: []string{"chaos:{abcd}x:result"}}},
			want: map[string]int{checkLeftovers: 2}},
		{name: "an answer delivered and no record stored",
			rec:  runRecord{Execs: []execution{e1}, Clients: clients(answer(0, e1, false, 0, 101)), End: stored(), Idempotency: true},
			want: map[string]int{checkLeftovers: 1}},
		{name: "a replay of an answer a later holder superseded",
			rec: runRecord{Execs: []execution{e1, ex("ex_2", 20, 260, 400)}, Clients: clients(answer(0, e1, false, 0, 101), answer(1, e1, true, 500, 510)),
				Faults: []faultEvent{outage}, Timeout: 100 * time.Millisecond, End: stored("k")},
			want: map[string]int{checkReplayLast: 1}, excused: 1}, // ex_2's run itself is in the window
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rec.TTL == 0 {
				tc.rec.TTL = time.Second
			}
			vs, ex := check(tc.rec)
			got := count(vs)
			n := 0
			for _, c := range ex.Counts {
				n += c
			}
			if n != tc.excused {
				t.Errorf("excused %v, want %d", ex.Counts, tc.excused)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("violations %v, want %v", got, tc.want)
				for _, v := range vs {
					t.Logf("[%s] %s: %s", v.Check, v.Key, v.Detail)
				}
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/lock"
	"github.com/reqlock/caddy-redis-lock/record"
)

// The checks, each a name in the report.
const (
	checkReplayBytes = "replay-bytes"    // an answer naming an execution is that execution's bytes
	checkReplayLast  = "replay-last"     // a replay never names an execution a later holder superseded
	checkOverlap     = "overlap"         // no two executions of a key at once
	checkAccount     = "account-overlap" // no two executions of an account at once (accounts run)
	checkFencing     = "fencing"         // tokens strictly increase per key, and per account, across executions
	checkKeyReused   = "key-reused"      // no 422 key-reused: every attempt of a key sends the same request
	checkRerun       = "rerun"           // no execution once the key's answer was delivered or replayed
	checkDeath       = "death-rerun"     // idempotency: no execution after one whose node was killed while it ran
	checkBounded     = "bounded"         // every attempt answered in time, every client a definite answer
	checkLeftovers   = "leftovers"       // no lock and no in-progress record left, a record per answered key
)

// violation is one broken rule, with what a person needs to look at it.
type violation struct {
	Check  string
	Key    string
	Detail string
}

// windows are the documented times in which a key may run again.
type windows struct {
	ttl time.Duration
	// tryInterval is how long after Redis answers again an answer given
	// while it was away may still be unstored: one completion try (at most
	// twice the command timeout against a hung Redis) and the 25ms between
	// tries, which Redis's return cuts short ("a retry ... within a try's
	// interval of Redis's return"), and 100ms of scheduling on a loaded
	// machine.
	tryInterval time.Duration
	empty       []faultEvent // Redis restarted empty: locks and records lost
	kills       []faultEvent // a Caddy node killed mid-request
	outages     []faultEvent // Redis paused or down, or every node's link to it dead or held, then back with its data
	cuts        []faultEvent // some nodes cut off from Redis, the others not
}

func newWindows(faults []faultEvent, ttl, timeout time.Duration) windows {
	w := windows{ttl: ttl, tryInterval: 2*timeout + 25*time.Millisecond + 100*time.Millisecond}
	for _, f := range faults {
		if f.Return.IsZero() {
			continue
		}
		switch f.Kind {
		case redisRestartEmpty:
			w.empty = append(w.empty, f)
		case nodeKill:
			w.kills = append(w.kills, f)
		case redisPause, redisKillAOF, netRedisBlackHole, netRedisHold:
			// A black hole or a hold on every node's link is Redis away for
			// all of them, as a pause is: a hold delivers at the heal what
			// waited, as a paused Redis runs what waited in its buffers.
			w.outages = append(w.outages, f)
		case netRedisPartition, netRedisHoldSome:
			// A hold on half the connections cuts off a node all of whose
			// connections drew it (seed 2: node 0 reached Redis with no
			// command for 2.6s, past the lease): as a partition, its
			// answer may go unstored and a retry elsewhere run again.
			w.cuts = append(w.cuts, f)
		}
	}
	return w
}

// emptyEnd is the end of the window after an empty restart: the locks it
// dropped were held for at most a lease more by holders that do not know,
// and a second for their answers to be stored.
func (w windows) emptyEnd(f faultEvent) time.Time { return f.Return.Add(w.ttl + time.Second) }

// whyTryInterval is the excuse of a re-run just after Redis came back.
const whyTryInterval = "re-runs within a try's interval of Redis's return"

// whyCut is the excuse of a re-run after an answer given by a node cut off
// from Redis while the others were not.
const whyCut = "re-runs after an answer by a node cut off from Redis"

// rerunExcused says whether an execution starting at start, after an
// answer delivered at delivered by node, falls in a documented window.
func (w windows) rerunExcused(delivered time.Time, node int, start time.Time) string {
	for _, f := range w.empty {
		if delivered.Before(f.Return) && start.After(f.Start) {
			return "re-runs after an empty restart"
		}
	}
	if w.emptyCovers(start) {
		return "re-runs after an empty restart"
	}
	for _, f := range w.outages {
		if !delivered.Before(f.Start) && !delivered.After(f.Return) && w.afterReturn(f, start) {
			return whyTryInterval
		}
	}
	for _, f := range w.cuts {
		if w.cutCovers(f, delivered, node, start) {
			return whyCut
		}
	}
	return ""
}

// cutCovers says whether an answer that node gave at delivered, while f cut
// it off from Redis, may be run again at start: the answer could not be
// stored, the holder's lease ran out in Redis, and the nodes that still
// reach it may take the key, until a try's interval after the heal, when
// the holder's completion has got through.
func (w windows) cutCovers(f faultEvent, delivered time.Time, node int, start time.Time) bool {
	return slices.Contains(f.Nodes, node) && !delivered.Before(f.Start) && !delivered.After(f.Return) &&
		!start.Before(f.Start) && start.Before(f.Return.Add(w.tryInterval))
}

// afterReturn says whether t is within a try's interval of Redis's return
// from outage f: from when it could answer again to a try's interval after
// it did.
func (w windows) afterReturn(f faultEvent, t time.Time) bool {
	back := f.Back
	if back.IsZero() {
		back = f.Return
	}
	return !t.Before(back) && t.Before(f.Return.Add(w.tryInterval))
}

// emptyCovers says whether t is in an empty restart's window.
func (w windows) emptyCovers(t time.Time) bool {
	for _, f := range w.empty {
		if !t.Before(f.Start) && t.Before(w.emptyEnd(f)) {
			return true
		}
	}
	return false
}

// killedWith returns the node kill that a was in flight at: its node killed
// after it began at the backend and before its answer reached the node.
func (w windows) killedWith(a execution) (faultEvent, bool) {
	for _, f := range w.kills {
		if f.Node == a.Node && a.Start.Before(f.Start) && (a.End.After(f.Start) || a.WriteErr != "") {
			return f, true
		}
	}
	return faultEvent{}, false
}

// lostWithData says whether a record written at or before t may have been
// lost with Redis's data: an empty restart came after it.
func (w windows) lostWithData(t time.Time) bool {
	for _, f := range w.empty {
		if f.Start.After(t) {
			return true
		}
	}
	return false
}

// overlapExcused says whether a, in flight when Redis lost its data, may
// overlap b, which began after.
func (w windows) overlapExcused(a, b execution) bool {
	for _, f := range w.empty {
		if a.Start.Before(f.Return) && a.End.After(f.Start) && !b.Start.Before(f.Start) {
			return true
		}
	}
	return false
}

// redisState is what is left in Redis at the end.
type redisState struct {
	Locks      []string        // lock keys, with their fields and TTL
	InProgress []string        // records that are not completed, their lock held (or unreadable)
	Abandoned  []string        // records in progress whose lock is gone
	Records    map[string]bool // completed record keys
	Counters   int
	GoneMarks  int // marks of tokens given back (lock.GoneKey), which live a lease
	Err        string
}

// scanRedis lists every key under the prefix.
func scanRedis(ctx context.Context, addr string) redisState {
	st := redisState{Records: map[string]bool{}}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer c.Close()
	iter := c.Scan(ctx, 0, chaosPrefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		switch {
		case strings.HasSuffix(k, "}fence"):
			st.Counters++
		case strings.Contains(k, ":gone:"):
			st.GoneMarks++
		case strings.HasSuffix(k, ":result"):
			first, err := c.GetRange(ctx, k, 0, 0).Result()
			lock := strings.TrimSuffix(k, ":result")
			switch held, herr := c.Exists(ctx, lock).Result(); {
			case err == nil && first == "C":
				st.Records[k] = true
			case err == nil && herr == nil && first == "P" && held == 0:
				st.Abandoned = append(st.Abandoned, k)
			default:
				st.InProgress = append(st.InProgress, fmt.Sprintf("%s (first byte %q, %v)", k, first, err))
			}
		default:
			fields, _ := c.HGetAll(ctx, k).Result()
			ttl, _ := c.PTTL(ctx, k).Result()
			st.Locks = append(st.Locks, fmt.Sprintf("%s fields %v pttl %v", k, fields, ttl))
		}
	}
	if err := iter.Err(); err != nil {
		st.Err = err.Error()
	}
	return st
}

// runRecord is everything a run recorded, for the checks.
type runRecord struct {
	Execs       []execution
	Clients     []clientResult
	Faults      []faultEvent
	TTL         time.Duration
	Timeout     time.Duration
	Idempotency bool
	Wait        time.Duration // the route's wait for a held key or account
	End         redisState
}

// attemptBound is the longest an attempt of a patient client may wait for
// its answer: the route's wait for a held key or account, a lease, and a
// few seconds for Redis timeouts and the backend.
func attemptBound(ttl, wait time.Duration) time.Duration { return wait + ttl + 3*time.Second }

// recordKeyOf is the Redis key of the record of key (accountKey's form):
// the record of an idempotency key within its account's lock key, or of
// the idempotency key alone.
func recordKeyOf(key string) string {
	account, idem, ok := strings.Cut(key, "/")
	if !ok {
		return record.Key(lock.Key(chaosPrefix, "", key))
	}
	return record.Key(lock.Key(chaosPrefix, lock.Key(chaosPrefix, "", account), idem))
}

// excusals are what the documented windows excused: counts by window, and
// each re-run excused by Redis's return, so that a reader can judge it.
type excusals struct {
	Counts  map[string]int
	Details []string
}

// check runs every check on rec. It returns the violations, and what a
// documented window excused that would have been one.
func check(rec runRecord) ([]violation, excusals) {
	var vs []violation
	excused := excusals{Counts: map[string]int{}}
	add := func(check, key, format string, args ...any) {
		vs = append(vs, violation{Check: check, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
	w := newWindows(rec.Faults, rec.TTL, rec.Timeout)
	t0 := time.Time{}
	if len(rec.Execs) > 0 {
		t0 = rec.Execs[0].Start
	}
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			if t0.IsZero() || a.Start.Before(t0) {
				t0 = a.Start
			}
		}
	}
	at := func(t time.Time) string { return fmt.Sprintf("+%.3fs", t.Sub(t0).Seconds()) }

	byID := map[string]execution{}
	byKey := map[string][]execution{}
	for _, e := range rec.Execs {
		byID[e.ID] = e
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	deliveries := map[string][]attempt{}
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			if a.delivered() {
				deliveries[a.Key] = append(deliveries[a.Key], a)
			}
			// Every answer naming an execution is that execution's answer,
			// byte for byte, whether passed through or replayed.
			if a.Err == "" && a.ExecID != "" {
				e, ok := byID[a.ExecID]
				switch {
				case !ok:
					add(checkReplayBytes, a.Key, "client %d attempt %d (node %d, %s) names %s, which never ran", a.Client, a.N, a.Node, at(a.End), a.ExecID)
				case e.Key != a.Key:
					add(checkReplayBytes, a.Key, "client %d attempt %d got %s, an execution of key %s", a.Client, a.N, e.ID, e.Key)
				case e.Body == nil:
					add(checkReplayBytes, a.Key, "client %d attempt %d (replayed %v) names %s, which answered nothing (dropped)", a.Client, a.N, a.Replayed, e.ID)
				case a.Status != e.Status || !bytes.Equal(a.Body, e.Body):
					add(checkReplayBytes, a.Key, "client %d attempt %d (replayed %v, %s): status %d, %d bytes %q; %s answered %d, %d bytes %q",
						a.Client, a.N, a.Replayed, at(a.End), a.Status, len(a.Body), a.Body, e.ID, e.Status, len(e.Body), e.Body)
				case a.Replayed && notProcessed(e.Status):
					add(checkReplayBytes, a.Key, "client %d attempt %d got a replay of %s's %d, which is not stored", a.Client, a.N, e.ID, e.Status)
				}
			}
			if a.Err == "" && a.Replayed && a.ExecID != "" {
				// A later holder began (found no record, took the lock)
				// before this replay began: the record it replays was
				// written by a holder that had been superseded.
				e, ok := byID[a.ExecID]
				for _, r := range byKey[a.Key] {
					if !ok {
						break
					}
					if r.Fence > e.Fence && r.Start.After(e.Start) && r.Start.Before(a.Start) && !w.emptyCovers(r.Start) {
						add(checkReplayLast, a.Key, "client %d attempt %d (node %d, %s) got a replay of %s (fence %d, %s..%s), but %s (fence %d, node %d) began at %s, after it and before the replay",
							a.Client, a.N, a.Node, at(a.Start), e.ID, e.Fence, at(e.Start), at(e.End), r.ID, r.Fence, r.Node, at(r.Start))
						break
					}
				}
			}
			if a.Err == "" && a.Replayed && a.ExecID == "" && a.Problem != "outcome-unknown" && a.Problem != "not-replayable" {
				add(checkReplayBytes, a.Key, "client %d attempt %d: a replay (status %d) that names no execution: %q", a.Client, a.N, a.Status, a.Body)
			}
			if a.Patient && a.End.Sub(a.Start) > attemptBound(rec.TTL, rec.Wait) {
				add(checkBounded, a.Key, "client %d attempt %d (node %d) took %v (bound %v): status %d err %q",
					a.Client, a.N, a.Node, a.End.Sub(a.Start).Round(time.Millisecond), attemptBound(rec.TTL, rec.Wait), a.Status, a.Err)
			}
			if a.Err == "" && a.Status == 422 && a.Problem == "key-reused" {
				// Every attempt of a key sends the same method, path and
				// body: a 422 is another request's record met under the key
				// (another account's, say).
				add(checkKeyReused, a.Key, "client %d attempt %d (node %d, %s) was answered 422 key-reused", a.Client, a.N, a.Node, at(a.End))
			}
		}
		if !c.Definite {
			last := attempt{}
			if len(c.Attempts) > 0 {
				last = c.Attempts[len(c.Attempts)-1]
			}
			add(checkBounded, c.Key, "client %d: no definite answer after %d attempts in %v (last: status %d err %q problem %q)",
				c.Client, len(c.Attempts), c.Took.Round(time.Millisecond), last.Status, last.Err, last.Problem)
		}
	}

	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ex := byKey[k]
		sort.Slice(ex, func(i, j int) bool { return ex[i].Start.Before(ex[j].Start) })
		for j, b := range ex {
			if b.Fence <= 0 {
				add(checkFencing, k, "%s (node %d, %s) carried no fencing token (%q)", b.ID, b.Node, at(b.Start), b.FenceRaw)
			}
			for i := range j {
				a := ex[i]
				if b.Start.Before(a.End) && w.overlapExcused(a, b) {
					excused.Counts["overlaps across an empty restart"]++
				} else if b.Start.Before(a.End) {
					add(checkOverlap, k, "%s (node %d, %s..%s, fence %d) overlaps %s (node %d, %s..%s, fence %d)",
						b.ID, b.Node, at(b.Start), at(b.End), b.Fence, a.ID, a.Node, at(a.Start), at(a.End), a.Fence)
				}
			}
			if j > 0 && b.Fence > 0 && b.Fence <= ex[j-1].Fence {
				a := ex[j-1]
				add(checkFencing, k, "%s (node %d, %s) has fence %d, not above %s's %d (node %d, %s..%s, %s)",
					b.ID, b.Node, at(b.Start), b.Fence, a.ID, a.Fence, a.Node, at(a.Start), at(a.End), answered(a))
			}
			// A run after one that died with its node (idempotency): its
			// record was abandoned, and nothing may run it again, unless
			// the backend said it did not process it or Redis lost the
			// record with its data.
			if rec.Idempotency {
				for i := range j {
					a := ex[i]
					f, died := w.killedWith(a)
					switch {
					case !died || notProcessed(a.Status):
					case w.lostWithData(a.Start) || w.emptyCovers(b.Start):
						excused.Counts["re-runs after a node's death across an empty restart"]++
					default:
						add(checkDeath, k, "%s ran (node %d, %s, fence %d) after %s (node %d, %s..%s, fence %d) died with node %d killed at %s",
							b.ID, b.Node, at(b.Start), b.Fence, a.ID, a.Node, at(a.Start), at(a.End), a.Fence, f.Node, at(f.Start))
					}
					if died {
						break
					}
				}
			}
			// The earliest answer delivered before b began, outside the windows.
			ds := deliveries[k]
			sort.Slice(ds, func(i, j int) bool { return ds[i].End.Before(ds[j].End) })
			why := ""
			var excuser attempt
			for _, d := range ds {
				if !d.End.Before(b.Start) {
					break
				}
				if d.ExecID == "" && !ranBefore(ex[:j], d.End) {
					// An abandoned record's outcome-unknown, before any
					// run: its holder gave it back later (it knew nothing
					// ran), and b is the first run.
					continue
				}
				if why = w.rerunExcused(d.End, d.Node, b.Start); why != "" {
					excuser = d
					continue
				}
				what := "its answer"
				switch {
				case d.Replayed:
					what = "a replay"
				case d.ExecID == "":
					what = "outcome-unknown"
				}
				if byID[d.ExecID].Large {
					what += " (a large answer)"
				}
				add(checkRerun, k, "%s ran (node %d, %s, fence %d) after client %d attempt %d got %s at %s (status %d, %s, node %d)",
					b.ID, b.Node, at(b.Start), b.Fence, d.Client, d.N, what, at(d.End), d.Status, orNone(d.ExecID), d.Node)
				why = ""
				break
			}
			if why != "" {
				excused.Counts[why]++
				if why == whyTryInterval {
					for _, f := range w.outages {
						if w.afterReturn(f, b.Start) {
							excused.Details = append(excused.Details, fmt.Sprintf("%s of key %s (node %d) began %v after Redis's return from %s at %s",
								b.ID, k, b.Node, b.Start.Sub(f.Return).Round(time.Millisecond), f.Kind, at(f.Return)))
						}
					}
				}
				if why == whyCut {
					for _, f := range w.cuts {
						if w.cutCovers(f, excuser.End, excuser.Node, b.Start) {
							excused.Details = append(excused.Details, fmt.Sprintf("%s of key %s (node %d) began at %s, %v after the cut of nodes %v, %v before its heal; client %d had its answer from node %d at %s (%s)",
								b.ID, k, b.Node, at(b.Start), b.Start.Sub(f.Start).Round(time.Millisecond), f.Nodes,
								f.Return.Sub(b.Start).Round(time.Millisecond), excuser.Client, excuser.Node, at(excuser.End), orNone(excuser.ExecID)))
							break
						}
					}
				}
			}
		}
	}

	vs = append(vs, checkAccounts(rec.Execs, w, excused, at)...)

	if rec.End.Err != "" {
		add(checkLeftovers, "", "scanning Redis: %s", rec.End.Err)
	}
	for _, l := range rec.End.Locks {
		add(checkLeftovers, "", "lock left at the end: %s", l)
	}
	for _, r := range rec.End.InProgress {
		add(checkLeftovers, "", "record not completed at the end: %s", r)
	}
	for _, r := range rec.End.Abandoned {
		if !killedMidRequest(rec.Clients, w, r) {
			add(checkLeftovers, "", "record abandoned at the end, with no node killed under it: %s", r)
		}
	}
	if rec.Idempotency && rec.End.Err == "" {
		var lastEmpty time.Time
		for _, f := range w.empty {
			lastEmpty = f.Return
		}
		dkeys := make([]string, 0, len(deliveries))
		for k := range deliveries {
			dkeys = append(dkeys, k)
		}
		sort.Strings(dkeys)
		for _, k := range dkeys {
			var last attempt
			for _, d := range deliveries[k] {
				if d.End.After(last.End) {
					last = d
				}
			}
			if !last.End.After(lastEmpty) {
				continue
			}
			// An outcome-unknown with no execution is an abandoned record's:
			// still there, or given back later by its holder, which knew
			// that nothing ran.
			unknownUnrun := last.ExecID == "" && len(byKey[k]) == 0
			if rk := recordKeyOf(k); !rec.End.Records[rk] && !(last.ExecID == "" && slices.Contains(rec.End.Abandoned, rk)) && !unknownUnrun {
				add(checkLeftovers, k, "client %d got an answer at %s (status %d, replayed %v, %s) but no record is stored (%s)",
					last.Client, at(last.End), last.Status, last.Replayed, orNone(last.ExecID), rk)
			}
		}
	}
	return vs, excused
}

// ranBefore says whether one of execs began before t.
func ranBefore(execs []execution, t time.Time) bool {
	for _, e := range execs {
		if e.Start.Before(t) {
			return true
		}
	}
	return false
}

// killedMidRequest says whether rkey, a record left abandoned at the end,
// belongs to a key an attempt of which reached a node before it was
// killed: its request may still have been anywhere between the begin and
// the backend, detached from its client, or its give-back waiting for
// Redis, when the node died.
func killedMidRequest(clients []clientResult, w windows, rkey string) bool {
	for _, c := range clients {
		for _, a := range c.Attempts {
			if recordKeyOf(a.Key) != rkey {
				continue
			}
			for _, f := range w.kills {
				if f.Node == a.Node && a.Start.Before(f.Start) {
					return true
				}
			}
		}
	}
	return false
}

// whyAccountEmpty is the excuse of two executions of an account at once
// across an empty restart.
const whyAccountEmpty = "account overlaps across an empty restart"

// checkAccounts checks the executions of each account (with
// `idempotency { key }`): none began while another of its account was in
// progress (the backend's Concurrent), outside the window the key's own
// overlap check has (one in flight when Redis restarted empty, the other
// begun after: the account's lock was lost with the data), and each
// carries a fencing token, the account lock's, strictly above the one of
// the account's execution before it, unless the two overlap (then the
// overlap is what is reported, or excused).
func checkAccounts(execs []execution, w windows, excused excusals, at func(time.Time) string) []violation {
	var vs []violation
	byID := map[string]execution{}
	byAccount := map[string][]execution{}
	for _, e := range execs {
		byID[e.ID] = e
		if e.Account != "" {
			byAccount[e.Account] = append(byAccount[e.Account], e)
		}
	}
	accounts := slices.Sorted(maps.Keys(byAccount))
	for _, acct := range accounts {
		ex := byAccount[acct]
		sort.SliceStable(ex, func(i, j int) bool { return ex[i].Start.Before(ex[j].Start) })
		for j, b := range ex {
			for _, id := range b.Concurrent {
				a, ok := byID[id]
				if !ok {
					continue
				}
				if w.overlapExcused(a, b) {
					excused.Counts[whyAccountEmpty]++
					continue
				}
				vs = append(vs, violation{Check: checkAccount, Key: acct, Detail: fmt.Sprintf(
					"%s of %s (node %d, %s..%s, fence %d) began while %s of %s (node %d, %s..%s, fence %d, %s) was in progress",
					b.ID, b.Key, b.Node, at(b.Start), at(b.End), b.Fence, a.ID, a.Key, a.Node, at(a.Start), at(a.End), a.Fence, answered(a))})
			}
			if j == 0 {
				continue
			}
			a := ex[j-1]
			if b.Fence > 0 && a.Fence > 0 && b.Fence <= a.Fence && !b.Start.Before(a.End) {
				vs = append(vs, violation{Check: checkFencing, Key: acct, Detail: fmt.Sprintf(
					"%s of %s (node %d, %s) has fence %d, not above %d of the account's execution before it, %s of %s (node %d, %s..%s, %s)",
					b.ID, b.Key, b.Node, at(b.Start), b.Fence, a.Fence, a.ID, a.Key, a.Node, at(a.Start), at(a.End), answered(a))})
			}
		}
	}
	return vs
}

// answered says what an execution answered, for the details.
func answered(e execution) string {
	switch {
	case e.Body == nil:
		return "its connection dropped without an answer"
	case e.WriteErr != "":
		return fmt.Sprintf("answered %d, not written: %s", e.Status, e.WriteErr)
	}
	return fmt.Sprintf("answered %d", e.Status)
}

func orNone(s string) string {
	if s == "" {
		return "no execution"
	}
	return s
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/lock"
)

// A payment's slot is its record's, which is its lock's (one hash tag).
func TestKeySlots(t *testing.T) {
	plans := []keyPlan{{Key: "pay_00001", At: time.Second}, {Key: "pay_00002", At: 2 * time.Second}}
	for i, ks := range keySlots(plans) {
		lk := lock.Key(chaosPrefix, "", plans[i].Key)
		if ks.At != plans[i].At || ks.Slot != redistest.SlotOf(lk) || ks.Slot != redistest.SlotOf(recordKeyOf(plans[i].Key)) {
			t.Errorf("%s: %+v, its lock's slot %d", plans[i].Key, ks, redistest.SlotOf(lk))
		}
	}
	if tag := slotTag(1234); redistest.SlotOf("{"+tag+"}x") != 1234 {
		t.Errorf("slotTag(1234) = %q, in slot %d", tag, redistest.SlotOf(tag))
	}
}

// A fault's line counts the 503s among the attempts in flight from its
// start to its return, and only those.
func TestRefusedDuring(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	f := faultEvent{Start: at(10), Return: at(14)}
	rec := runRecord{Clients: []clientResult{{Attempts: []attempt{
		{Start: at(9), End: at(11), Status: 503, Problem: "unavailable"}, // in flight at the start
		{Start: at(12), End: at(12.5), Status: 200},                      // during
		{Start: at(13), End: at(16), Status: 503},                        // during, the backend's
		{Start: at(8), End: at(9), Status: 503},                          // before
		{Start: at(15), End: at(16), Status: 503},                        // after
		{Start: at(11), End: at(12), Err: "timeout"},
	}}}}
	if got := refusedDuring(rec, f); !strings.HasPrefix(got, "503 unavailable x1 (and the backend's x1) of 4 ") {
		t.Errorf("refusedDuring = %q, want one 503 of each of 4 attempts", got)
	}
}

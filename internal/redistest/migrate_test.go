package redistest

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// A slot with keys moves to another master, keys and all, and SlotOf
// agrees with the Cluster's CLUSTER KEYSLOT.
func TestMigrateSlot(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 2, 0)
	ctx := Context(t, time.Minute)
	const tag = "{migrate}"
	v, err := Do(ctx, c.Addrs()[0], nil, "CLUSTER", "KEYSLOT", tag)
	if err != nil {
		t.Fatal(err)
	}
	slot := SlotOf("app:" + tag + ":0")
	if v != int64(slot) || SlotOf(tag) != slot || SlotOf("migrate") != slot {
		t.Fatalf("SlotOf %d, CLUSTER KEYSLOT %v", slot, v)
	}
	from, err := c.MasterOfSlot(slot)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if _, err := Do(ctx, from, nil, "SET", fmt.Sprintf("app:%s:%d", tag, i), strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var to string
	for _, m := range c.MasterAddrs() {
		if m != from {
			to = m
		}
	}
	if _, err := c.MigrateSlot(ctx, slot, to, 10, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, addr := range c.Addrs() {
		view, err := clusterView(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range view {
			if n.serves(slot) != (n.addr == to) {
				t.Fatalf("%s sees slot %d on %s: %s", addr, slot, n.addr, n.slots)
			}
		}
	}
	for i := range 25 {
		if got, err := DoString(ctx, to, nil, "GET", fmt.Sprintf("app:%s:%d", tag, i)); err != nil || got != strconv.Itoa(i) {
			t.Fatalf("key %d on the new master: %q %v", i, got, err)
		}
	}
	if n, err := Do(ctx, from, nil, "CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); err != nil || n != int64(0) {
		t.Fatalf("keys left on the old master: %v %v", n, err)
	}
}

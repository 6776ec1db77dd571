package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The phantoms in a monitor log: a lock whose fencing token ran is not
// one; one given back at once is counted but not held; one left to its
// lease, with no give-back's mark, is held and never given back.
func TestFindPhantoms(t *testing.T) {
	dir := t.TempDir()
	log := `OK
1.000000 [0 127.0.0.1:1] "evalsha" "sha" "4" "k1"
1.000100 [0 lua] "HSET" "p:{a}k1" "tok-ran" "1000000000000001"
1.100000 [0 lua] "HSET" "p:{b}k2" "tok-back" "1000000000000002"
1.200000 [0 lua] "SET" "p:{b}k2:gone:tok-back" "1" "PX" "2000"
1.200010 [0 lua] "HDEL" "p:{b}k2" "tok-back" "w:tok-back"
1.300000 [0 lua] "HSET" "p:{c}k3" "tok-left" "1000000000000003"
1.400000 [0 lua] "HSET" "p:{d}k4" "tok-late" "1000000000000004"
3.000000 [0 lua] "SET" "p:{d}k4:gone:tok-late" "1" "PX" "2000"
`
	if err := os.WriteFile(filepath.Join(dir, "redis-monitor.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := findPhantoms(dir, []execution{{FenceRaw: "1000000000000001"}}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := phantoms{Taken: 4, NeverRan: 3, Long: 2, NotGivenBack: 1}
	if got != want {
		t.Fatalf("phantoms %+v, want %+v", got, want)
	}
}

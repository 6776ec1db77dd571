package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// monitorRedis writes every command Redis runs (redis-cli's MONITOR), with
// its time and client address, to redis-monitor.log in dir until ctx ends,
// starting it again after a restart: the AOF holds only what changed data,
// and a give-back that found nothing, or a lookup, leaves no trace there.
// Redis's documentation warns that one MONITOR client can halve its
// throughput: it is for diagnosing a run, not for the figures.
func monitorRedis(ctx context.Context, dir, addr string) (func(), error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("-monitor needs redis-cli: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "redis-monitor.log"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cmd := exec.CommandContext(ctx, cli, "-u", "redis://"+addr, "monitor")
			cmd.Stdout = f
			_ = cmd.Run() // ends with Redis (a restart) or ctx
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			f.Close()
		})
	}, nil
}

// phantoms are the locks the monitor saw taken by begins whose request
// never reached the backend (its fencing token in no execution): a begin
// whose reply came too late, or that reached Redis after its caller gave
// up. Each should be given back at once; one held until its lease ran out
// answered 409 to every retry meanwhile.
type phantoms struct {
	Taken, NeverRan    int // locks taken; of them, by requests that never ran
	Long, NotGivenBack int // of those, held over half a lease; of those, never given back
}

// findPhantoms reads the monitor's log in dir. Only for runs whose fencing
// tokens are their records' (no accounts: there the backend sees the
// account's).
func findPhantoms(dir string, execs []execution, ttl time.Duration) (phantoms, error) {
	f, err := os.Open(filepath.Join(dir, "redis-monitor.log"))
	if err != nil {
		return phantoms{}, err
	}
	defer f.Close()
	ran := map[string]bool{}
	for _, e := range execs {
		ran[e.FenceRaw] = true
	}
	type lock struct {
		at    float64
		fence string
	}
	taken := map[string]lock{}       // token: the lock it took
	released := map[string]float64{} // token: the first HDEL naming it
	marked := map[string]bool{}      // token: a give-back's mark was written
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		// 1796576011.889828 [0 lua] "HSET" "key" "token" "fence" ...
		ts, rest, ok := strings.Cut(sc.Text(), " [")
		if !ok {
			continue
		}
		who, cmd, ok := strings.Cut(rest, "] ")
		if !ok {
			continue
		}
		at, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			continue
		}
		args := strings.Split(strings.Trim(cmd, `"`), `" "`)
		name := strings.ToUpper(args[0])
		switch {
		case name == "HSET" && strings.HasSuffix(who, " lua") && len(args) >= 4 && len(args[3]) == 16:
			if _, seen := taken[args[2]]; !seen {
				taken[args[2]] = lock{at, args[3]}
			}
		case name == "HDEL":
			for _, a := range args[2:] {
				if _, seen := released[a]; !seen {
					released[a] = at
				}
			}
		case name == "SET" && len(args) > 1 && strings.Contains(args[1], ":gone:"):
			_, tok, _ := strings.Cut(args[1], ":gone:")
			marked[tok] = true
		}
	}
	if err := sc.Err(); err != nil {
		return phantoms{}, err
	}
	p := phantoms{Taken: len(taken)}
	lease := ttl.Seconds()
	for tok, l := range taken {
		if ran[l.fence] {
			continue
		}
		p.NeverRan++
		end := l.at + lease
		if r, ok := released[tok]; ok && r < end {
			end = r
		}
		if end-l.at > lease/2 {
			p.Long++
			if !marked[tok] {
				p.NotGivenBack++
			}
		}
	}
	return p, nil
}

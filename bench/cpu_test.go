package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// CPU time per op, of this process (the clients) and of redis-server. On a
// shared 2-core machine ns/op moves with everyone else's load; CPU time per op
// moves much less, and it tells whether a library costs more on the client or
// in Redis (scripts).

// redisPID is the benchmark's redis-server, 0 when it cannot be found (not
// Linux): then only the client's CPU is reported.
var redisPID int

// findRedisPID finds the redis-server listening on port through /proc, since
// redistest does not expose the process. redis-server rewrites its command
// line to "redis-server 127.0.0.1:<port>", so both forms are matched.
func findRedisPID(port int) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	p := strconv.Itoa(port)
	forms := [][]byte{[]byte("--port\x00" + p + "\x00"), []byte(":" + p + " "), []byte(":" + p + "\x00")}
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil || !bytes.Contains(b, []byte("redis-server")) {
			continue
		}
		found := false
		for _, f := range forms {
			found = found || bytes.Contains(b, f)
		}
		if !found {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err == nil {
			return pid
		}
	}
	return 0
}

// procCPU is a process's user+system CPU time in clock ticks (USER_HZ, 100
// on Linux), or -1.
func procCPU(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

func selfCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

type cpuMeter struct {
	b            *testing.B
	self, server int64
}

func startCPU(b *testing.B) cpuMeter {
	m := cpuMeter{b: b, self: selfCPU(), server: -1}
	if redisPID != 0 {
		m.server = procCPU(redisPID)
	}
	return m
}

// report adds client-cpu-ns/op and redis-cpu-ns/op.
func (m cpuMeter) report() {
	n := int64(m.b.N)
	if n == 0 {
		return
	}
	if s := selfCPU(); s >= 0 && m.self >= 0 {
		m.b.ReportMetric(float64(s-m.self)/float64(n), "client-cpu-ns/op")
	}
	if m.server >= 0 {
		if s := procCPU(redisPID); s >= 0 {
			m.b.ReportMetric(float64(s-m.server)*1e7/float64(n), "redis-cpu-ns/op")
		}
	}
}

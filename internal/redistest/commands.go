package redistest

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Commands is a go-redis hook that records what a client sends: each
// command's name, in lower case, and each round trip (a command on its own,
// or a pipeline, as an autopipeliner sends them).
type Commands struct {
	mu    sync.Mutex
	cmds  []string
	trips int
}

func (c *Commands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *Commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *Commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}

func (c *Commands) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips++
	for _, cmd := range cmds {
		c.cmds = append(c.cmds, strings.ToLower(cmd.Name()))
	}
}

// Take returns the commands and round trips since the last Take.
func (c *Commands) Take() (cmds []string, trips int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmds, trips = c.cmds, c.trips
	c.cmds, c.trips = nil, 0
	return cmds, trips
}

// Calls is the server at addr's count of calls of the command name (INFO
// commandstats), which counts commands run inside scripts too.
func Calls(t testing.TB, addr, name string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := DoString(ctx, addr, nil, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^cmdstat_` + regexp.QuoteMeta(name) + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

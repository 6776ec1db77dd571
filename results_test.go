package redislock

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's placeholder table lists exactly the results the handler
// produces, in the same order.
func TestREADMEListsResults(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "| `{http.redis_lock.result}`") {
			row = line
			break
		}
	}
	if row == "" {
		t.Fatal("README.md has no placeholder table row for {http.redis_lock.result}")
	}
	var got []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row, -1) {
		got = append(got, m[1])
	}
	if want := resultNames(); !slices.Equal(got, want) {
		t.Errorf("README lists results %v, want %v", got, want)
	}
}

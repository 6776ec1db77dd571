package redislock

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docs/reference.md lists exactly the results the handler produces, in the
// same order: in the placeholder table's row for {http.redis_lock.result},
// and in the results table with the meanings of results.go.
func TestDocsListResults(t *testing.T) {
	b, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	var table []struct{ name, meaning string }
	resultRow := regexp.MustCompile("^\\| `([a-z_]+)` \\| (.*) \\|$")
	for line := range strings.Lines(string(b)) {
		line = strings.TrimRight(line, "\n")
		if row == "" && strings.HasPrefix(line, "| `{http.redis_lock.result}`") {
			row = line
		}
		if m := resultRow.FindStringSubmatch(line); m != nil && slices.Contains(resultNames(), m[1]) {
			table = append(table, struct{ name, meaning string }{m[1], m[2]})
		}
	}
	if row == "" {
		t.Fatal("docs/reference.md has no placeholder table row for {http.redis_lock.result}")
	}
	var got []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row, -1) {
		got = append(got, m[1])
	}
	if want := resultNames(); !slices.Equal(got, want) {
		t.Errorf("the placeholder table lists results %v, want %v", got, want)
	}
	if len(table) != len(results) {
		t.Fatalf("the results table has %d rows, want %d (one per result of results.go)", len(table), len(results))
	}
	for i, r := range results {
		if table[i].name != r.name || table[i].meaning != r.meaning {
			t.Errorf("results table row %d: %q: %q, want %q: %q", i+1, table[i].name, table[i].meaning, r.name, r.meaning)
		}
	}
}

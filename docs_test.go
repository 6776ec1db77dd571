package redislock

// The documentation against the repository and the code: every relative
// link and #anchor resolves, the README's Caddyfiles load as a user copies
// them, and the tables that mirror the code (metrics, the minimal ACL user)
// say what the code does. The results table: results_test.go.

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus"
)

// docFiles are the markdown files whose links are checked.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "lock/README.md", "bench/README.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	return append(files, docs...)
}

// mdLink is an inline link or image: [text](target) or [text](target "title").
var mdLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// codeSpan is inline code, whose brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

// mdProse returns the lines of a markdown file outside fenced code blocks,
// with their line numbers.
func mdProse(src string) (lines []string, numbers []int) {
	fence := ""
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		lines = append(lines, line)
		numbers = append(numbers, i+1)
	}
	return lines, numbers
}

// headingSlugs are the anchors GitHub gives the headings of a markdown
// file: the text lowercased, punctuation but '-' and '_' dropped, spaces
// turned into '-', and -1, -2, ... after a repeated slug.
func headingSlugs(src string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	lines, _ := mdProse(src)
	for _, line := range lines {
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, "#")
		if !strings.HasPrefix(text, " ") {
			continue
		}
		s := githubSlug(strings.TrimSpace(text))
		if n := seen[s]; n > 0 {
			slugs[s+"-"+strconv.Itoa(n)] = true
		} else {
			slugs[s] = true
		}
		seen[s]++
	}
	return slugs
}

// githubSlug is a heading's anchor on GitHub. Links in a heading count by
// their text.
func githubSlug(heading string) string {
	heading = mdLink.ReplaceAllStringFunc(heading, func(l string) string {
		return l[1:strings.Index(l, "](")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestDocsSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Replicas: failovers that lose nothing acknowledged": "replicas-failovers-that-lose-nothing-acknowledged",
		"`go run` during development":                        "go-run-during-development",
		"The lock lasts as long as the backend's work":       "the-lock-lasts-as-long-as-the-backends-work",
		"Kleppmann vs antirez":                               "kleppmann-vs-antirez",
		"The lock is a hash, released with `HDEL`":           "the-lock-is-a-hash-released-with-hdel",
		"`make bench`: the lock library beside its peers":    "make-bench-the-lock-library-beside-its-peers",
		"A [linked](x.md) heading":                           "a-linked-heading",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// Every relative link in the docs names a file or folder that exists, and
// every #anchor on a markdown file names one of its headings.
func TestDocsLinks(t *testing.T) {
	slugsOf := map[string]map[string]bool{}
	slugs := func(path string) map[string]bool {
		if s, ok := slugsOf[path]; ok {
			return s
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		slugsOf[path] = headingSlugs(string(b))
		return slugsOf[path]
	}
	checked := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines, numbers := mdProse(string(b))
		for i, line := range lines {
			line = codeSpan.ReplaceAllString(line, "``")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				where := file + ":" + strconv.Itoa(numbers[i])
				path, anchor, _ := strings.Cut(target, "#")
				if path == "" {
					path = file
				} else {
					path = filepath.Join(filepath.Dir(file), path)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %s does not exist", where, target, path)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s: link %q: an anchor on a file that is not markdown", where, target)
					continue
				}
				if !slugs(path)[anchor] {
					t.Errorf("%s: link %q: %s has no heading #%s", where, target, path, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links found: is the link pattern still right?", checked)
	}
}

// caddyfileBlocks are the ```caddyfile blocks of a markdown file.
func caddyfileBlocks(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// Every Caddyfile in the README is complete: it adapts with no warning and
// loads as `caddy validate` loads it, with no Redis. The checkout form and
// wallet recipes are testdata/adapt/checkout_form.caddyfile and
// wallet.caddyfile, byte for byte.
func TestDocsREADMECaddyfiles(t *testing.T) {
	t.Parallel()
	blocks := caddyfileBlocks(t, "README.md")
	if len(blocks) < 5 {
		t.Fatalf("README.md has %d caddyfile blocks, want the first Caddyfile and the recipes", len(blocks))
	}
	for _, name := range []string{"checkout_form", "wallet"} {
		recipe, err := os.ReadFile(filepath.Join("testdata", "adapt", name+".caddyfile"))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(blocks, string(recipe)) {
			t.Errorf("a README recipe differs from testdata/adapt/%s.caddyfile: copy it there and run go test -run TestAdapt -update", name)
		}
	}
	for i, cf := range blocks {
		out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "README.md"})
		if err != nil {
			t.Errorf("README caddyfile block %d: %v\n%s", i+1, err, cf)
			continue
		}
		for _, w := range warnings {
			t.Errorf("README caddyfile block %d: adapt warning: %s", i+1, w)
		}
		if !bytes.Contains(out, []byte(`"handler":"redis_lock"`)) {
			t.Errorf("README caddyfile block %d has no redis_lock handler", i+1)
		}
		if err := validateJSON(t, out); err != nil {
			t.Errorf("README caddyfile block %d does not load: %v\n%s", i+1, err, cf)
		}
	}
}

// The metrics table in docs/operations.md lists every metric the plugin
// exports, and the docs name no metric it does not.
func TestDocsListMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		if !bytes.Contains(b, []byte("| `"+f.GetName()+"` |")) {
			t.Errorf("docs/operations.md has no metrics table row for %s", f.GetName())
		}
	}
	name := regexp.MustCompile(`caddy_redis_lock_[a-z_]+`)
	for _, file := range docFiles(t) {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range name.FindAllString(string(src), -1) {
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("%s names %s, which the plugin does not export", file, n)
			}
		}
	}
}

// The minimal ACL user of docs/topologies.md is the one tlsacl_test.go
// runs the handler as.
func TestDocsMinimalACL(t *testing.T) {
	b, err := os.ReadFile("docs/topologies.md")
	if err != nil {
		t.Fatal(err)
	}
	var rule string
	for line := range strings.Lines(string(b)) {
		if r, ok := strings.CutPrefix(strings.TrimSpace(line), "ACL SETUSER caddy on >PASSWORD "); ok {
			rule = "on " + r
		}
	}
	if rule != minimalACL {
		t.Errorf("docs/topologies.md's ACL rule:\n%s\nwant (tlsacl_test.go's minimalACL):\n%s", rule, minimalACL)
	}
}

// The README's first Caddyfile is the one scripts/readme-check.sh runs in
// CI: it holds the addresses that script replaces.
func TestDocsREADMEFirstCaddyfile(t *testing.T) {
	blocks := caddyfileBlocks(t, "README.md")
	if len(blocks) == 0 {
		t.Fatal("README.md has no caddyfile block")
	}
	for _, s := range []string{":8080 {", "redis 127.0.0.1:6379", "reverse_proxy 127.0.0.1:9000", "{http.request.header.Idempotency-Key}"} {
		if !strings.Contains(blocks[0], s) {
			t.Errorf("the README's first Caddyfile has no %q, which scripts/readme-check.sh replaces or relies on:\n%s", s, blocks[0])
		}
	}
}

// Every problem's type URI resolves: problemTypeBase is the reference's URL,
// and each slug is a heading of its "Problem types", whose own anchor it is
// (no other heading takes it first).
func TestDocsProblemTypes(t *testing.T) {
	t.Parallel()
	if !strings.HasSuffix(problemTypeBase, "/blob/main/docs/reference.md#") {
		t.Fatalf("problemTypeBase %q is not docs/reference.md's URL", problemTypeBase)
	}
	b, err := os.ReadFile(filepath.Join("docs", "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	_, section, ok := strings.Cut(src, "\n## Problem types\n")
	if !ok {
		t.Fatal(`docs/reference.md has no "## Problem types"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	slugs := headingSlugs(src)
	for _, p := range allProblems {
		if !strings.Contains(section, "\n### "+p.p.slug+"\n") || !slugs[p.p.slug] {
			t.Errorf("problem %s has no heading of its own under Problem types in docs/reference.md", p.p.slug)
		}
	}
}

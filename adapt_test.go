package redislock

// Golden tests of the Caddyfile adapter: testdata/adapt/NAME.caddyfile is
// adapted to JSON and compared with NAME.json; for error_*.caddyfile the
// error (of adapting, or else of loading the config, as `caddy validate`
// does) is compared with NAME.err. `go test -run TestAdapt -update`
// rewrites the golden files; review the diff before committing it.

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

var update = flag.Bool("update", false, "rewrite the golden files of TestAdapt")

// adaptFile adapts a Caddyfile the way `caddy adapt` does, with the file's
// base name as the name that error messages cite.
func adaptFile(t *testing.T, path string) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": filepath.Base(path)})
}

// validateJSON loads a config without starting it, as `caddy validate`
// does: every module is provisioned and validated.
func validateJSON(t *testing.T, cfgJSON []byte) error {
	t.Helper()
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	// Validation provisions apps and logs next to the running config of
	// the tests through Caddy: keep them apart.
	caddyMu.Lock()
	defer caddyMu.Unlock()
	return caddy.Validate(&cfg)
}

func TestAdapt(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "adapt", "*.caddyfile"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/adapt/*.caddyfile: %v", err)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".caddyfile")
		t.Run(name, func(t *testing.T) {
			if strings.HasPrefix(name, "error_") {
				checkAdaptError(t, path)
				return
			}
			out, warnings, err := adaptFile(t, path)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			for _, w := range warnings {
				t.Errorf("adapt warning: %s", w)
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			buf.WriteByte('\n')
			golden := strings.TrimSuffix(path, ".caddyfile") + ".json"
			compareGolden(t, golden, buf.Bytes())
			if src, _ := os.ReadFile(path); bytes.Contains(src, []byte("# adapt only")) {
				return
			}
			if err := validateJSON(t, out); err != nil {
				t.Errorf("the adapted config does not validate: %v", err)
			}
		})
	}
}

// fileLine matches the place a Caddyfile error cites: name.caddyfile:N.
var fileLine = regexp.MustCompile(`error_[a-z_]+\.caddyfile:[0-9]+`)

func checkAdaptError(t *testing.T, path string) {
	t.Helper()
	out, _, err := adaptFile(t, path)
	var got string
	if err != nil {
		if !fileLine.MatchString(err.Error()) || !strings.Contains(err.Error(), filepath.Base(path)) {
			t.Errorf("adapt error does not cite the file and line: %v", err)
		}
		got = "adapt: " + err.Error() + "\n"
	} else {
		verr := validateJSON(t, out)
		if verr == nil {
			t.Fatal("the Caddyfile adapted and validated; want an error")
		}
		got = "validate: " + verr.Error() + "\n"
	}
	compareGolden(t, strings.TrimSuffix(path, ".caddyfile")+".err", []byte(got))
}

func compareGolden(t *testing.T, golden string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestAdapt -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -run TestAdapt -update rewrites it)\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}

// TestCaddyfileExample checks that the example shipped at the repository
// root adapts and validates offline: no Redis is needed to load a config.
func TestCaddyfileExample(t *testing.T) {
	t.Parallel()
	out, warnings, err := adaptFile(t, "Caddyfile.example")
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("adapt warning: %s", w)
	}
	if !bytes.Contains(out, []byte(`"handler":"redis_lock"`)) {
		t.Fatal("the example configures no redis_lock handler")
	}
	if err := validateJSON(t, out); err != nil {
		t.Fatalf("validate: %v", err)
	}
}

// Command metricsplot draws the plugin's metrics from a series of scrapes of
// Caddy's /metrics (such as `make chaos ARGS=-scrape=FILE` writes) as an
// SVG: requests per second by result, the failures that need a look, and
// the p99 time to take a lock, with the faults marked.
//
//	cd tools && go run ./metricsplot < scrapes.txt > ../docs/metrics.svg
//
// The input is blocks of Prometheus text, each after a line "# scrape <s>"
// (seconds since the start), and lines "# fault <s> <name>".
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape is one read of /metrics.
type scrape struct {
	at       float64
	families map[string]*dto.MetricFamily
}

type fault struct {
	at   float64
	name string
}

func main() {
	scrapes, faults, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "metricsplot:", err)
		os.Exit(1)
	}
	if len(scrapes) < 2 {
		fmt.Fprintln(os.Stderr, "metricsplot: fewer than two scrapes")
		os.Exit(1)
	}
	draw(os.Stdout, scrapes, faults)
}

func read(in io.Reader) ([]scrape, []fault, error) {
	var scrapes []scrape
	var faults []fault
	var block strings.Builder
	at := math.NaN()
	flush := func() error {
		if math.IsNaN(at) {
			return nil
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(block.String()))
		if err != nil {
			return fmt.Errorf("scrape at %.1fs: %w", at, err)
		}
		scrapes = append(scrapes, scrape{at: at, families: fams})
		block.Reset()
		return nil
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# scrape "):
			if err := flush(); err != nil {
				return nil, nil, err
			}
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, "# scrape "), 64)
			if err != nil {
				return nil, nil, fmt.Errorf("bad line %q", line)
			}
			at = v
		case strings.HasPrefix(line, "# fault "):
			f := strings.Fields(strings.TrimPrefix(line, "# fault "))
			if len(f) == 2 {
				v, _ := strconv.ParseFloat(f[0], 64)
				faults = append(faults, fault{v, f[1]})
			}
		case strings.HasPrefix(line, "caddy_redis_lock_") || strings.HasPrefix(line, "# HELP caddy_redis_lock_") || strings.HasPrefix(line, "# TYPE caddy_redis_lock_"):
			block.WriteString(line)
			block.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	return scrapes, faults, flush()
}

// counter is the value of the counter name whose label (if any) is value.
func counter(s scrape, name, label, value string) float64 {
	f := s.families[name]
	if f == nil {
		return 0
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		if label == "" || labelOf(m, label) == value {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// increase is a counter's growth from a to b; a decrease is a restart of
// the process, which counts from zero again.
func increase(a, b float64) float64 {
	if b < a {
		return b
	}
	return b - a
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// labelValues are the values of label on the series of name.
func labelValues(s scrape, name, label string) []string {
	var out []string
	if f := s.families[name]; f != nil {
		for _, m := range f.GetMetric() {
			out = append(out, labelOf(m, label))
		}
	}
	sort.Strings(out)
	return out
}

// quantile is the q-quantile of histogram name's observations between
// scrapes a and b (linear within a bucket), NaN without any.
func quantile(a, b scrape, name string, q float64) float64 {
	fa, fb := a.families[name], b.families[name]
	if fa == nil || fb == nil || len(fb.GetMetric()) == 0 {
		return math.NaN()
	}
	ha, hb := fa.GetMetric()[0].GetHistogram(), fb.GetMetric()[0].GetHistogram()
	if hb.GetSampleCount() < ha.GetSampleCount() { // restarted
		ha = &dto.Histogram{Bucket: make([]*dto.Bucket, len(hb.GetBucket()))}
		for i := range ha.Bucket {
			ha.Bucket[i] = &dto.Bucket{}
		}
	}
	n := float64(hb.GetSampleCount() - ha.GetSampleCount())
	if n <= 0 {
		return math.NaN()
	}
	rank, prevCount, prevBound := q*n, 0.0, 0.0
	for i, bk := range hb.GetBucket() {
		c := float64(bk.GetCumulativeCount() - ha.GetBucket()[i].GetCumulativeCount())
		if c >= rank {
			if c == prevCount {
				return bk.GetUpperBound()
			}
			return prevBound + (bk.GetUpperBound()-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevCount, prevBound = c, bk.GetUpperBound()
	}
	return prevBound
}

// series is one line of a panel.
type series struct {
	name string
	pts  [][2]float64 // seconds, value
}

type panel struct {
	title string
	unit  string
	lines []series
}

func panels(scrapes []scrape, faults []fault) []panel {
	last := scrapes[len(scrapes)-1]
	rates := panel{title: "Requests per second, by result", unit: "req/s"}
	for _, result := range labelValues(last, "caddy_redis_lock_requests_total", "result") {
		s := series{name: result}
		nonzero := false
		for i := 1; i < len(scrapes); i++ {
			a, b := scrapes[i-1], scrapes[i]
			v := increase(counter(a, "caddy_redis_lock_requests_total", "result", result), counter(b, "caddy_redis_lock_requests_total", "result", result)) / (b.at - a.at)
			nonzero = nonzero || v > 0
			s.pts = append(s.pts, [2]float64{b.at, v})
		}
		if nonzero {
			rates.lines = append(rates.lines, s)
		}
	}
	trouble := panel{title: "Needing a look: cumulative counts", unit: ""}
	for _, c := range []struct{ name, metric, label, value string }{
		{"locks lost", "caddy_redis_lock_lost_total", "", ""},
		{"outcomes unknown", "caddy_redis_lock_outcomes_unknown_total", "", ""},
		{"releases failed", "caddy_redis_lock_release_total", "result", "error"},
		{"renewals failed", "caddy_redis_lock_renewals_total", "result", "error"},
	} {
		s := series{name: c.name}
		total := counter(scrapes[0], c.metric, c.label, c.value)
		s.pts = append(s.pts, [2]float64{scrapes[0].at, total})
		for i := 1; i < len(scrapes); i++ {
			total += increase(counter(scrapes[i-1], c.metric, c.label, c.value), counter(scrapes[i], c.metric, c.label, c.value))
			s.pts = append(s.pts, [2]float64{scrapes[i].at, total})
		}
		trouble.lines = append(trouble.lines, s)
	}
	wait := panel{title: "Time to take a lock (waits included), p50 and p99", unit: "ms"}
	for _, q := range []float64{0.5, 0.99} {
		s := series{name: fmt.Sprintf("p%g", q*100)}
		for i := 1; i < len(scrapes); i++ {
			if v := quantile(scrapes[i-1], scrapes[i], "caddy_redis_lock_wait_seconds", q); !math.IsNaN(v) {
				s.pts = append(s.pts, [2]float64{scrapes[i].at, v * 1000})
			}
		}
		wait.lines = append(wait.lines, s)
	}
	return []panel{rates, trouble, wait}
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

func draw(w io.Writer, scrapes []scrape, faults []fault) {
	const width, ph, left, right, top = 960, 230, 60, 170, 30
	ps := panels(scrapes, faults)
	t0, t1 := scrapes[0].at, scrapes[len(scrapes)-1].at
	height := len(ps)*ph + 20
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	x := func(t float64) float64 { return left + (t-t0)/(t1-t0)*float64(width-left-right) }
	for i, p := range ps {
		y0 := float64(i*ph + top)
		h := float64(ph - top - 25)
		maxV := 0.0
		for _, s := range p.lines {
			for _, pt := range s.pts {
				maxV = math.Max(maxV, pt[1])
			}
		}
		if maxV == 0 {
			maxV = 1
		}
		maxV = niceCeil(maxV)
		y := func(v float64) float64 { return y0 + h - v/maxV*h }
		fmt.Fprintf(w, `<text x="%d" y="%.0f" font-size="13" font-weight="bold">%s</text>`+"\n", left, y0-10, esc(p.title))
		fmt.Fprintf(w, `<rect x="%d" y="%.0f" width="%d" height="%.0f" fill="none" stroke="#ccc"/>`+"\n", left, y0, width-left-right, h)
		for _, g := range []float64{0, 0.5, 1} {
			fmt.Fprintf(w, `<text x="%d" y="%.0f" text-anchor="end">%s</text>`+"\n", left-5, y(g*maxV)+4, esc(fmtNum(g*maxV)+" "+p.unit))
		}
		for t := math.Ceil(t0/10) * 10; t <= t1; t += 10 {
			fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#666">%.0fs</text>`+"\n", x(t), y0+h+14, t)
		}
		for _, f := range faults {
			fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#999" stroke-dasharray="3,3"/>`+"\n", x(f.at), x(f.at), y0, y0+h)
			if i == 0 {
				fmt.Fprintf(w, `<text x="%.1f" y="%.0f" fill="#666" font-size="9" transform="rotate(-90 %.1f %.0f)">%s</text>`+"\n", x(f.at)-2, y0+h-4, x(f.at)-2, y0+h-4, esc(f.name))
			}
		}
		for j, s := range p.lines {
			color := palette[j%len(palette)]
			var b strings.Builder
			for k, pt := range s.pts {
				if k == 0 {
					b.WriteString("M")
				} else {
					b.WriteString(" L")
				}
				fmt.Fprintf(&b, "%.1f %.1f", x(pt[0]), y(pt[1]))
			}
			if len(s.pts) > 0 {
				fmt.Fprintf(w, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", b.String(), color)
			}
			fmt.Fprintf(w, `<rect x="%d" y="%.0f" width="10" height="10" fill="%s"/><text x="%d" y="%.0f">%s</text>`+"\n",
				width-right+10, y0+float64(j)*15, color, width-right+25, y0+float64(j)*15+9, esc(s.name))
		}
	}
	fmt.Fprintln(w, "</svg>")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

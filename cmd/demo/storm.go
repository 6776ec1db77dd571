package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// stormConfig is one storm of duplicate charges at one route.
type stormConfig struct {
	Name       string // route name in the report
	URL        string // POST target
	RunID      string // keeps order ids apart between routes and runs
	Orders     int
	Duplicates int           // requests per order, all sent at once
	Timeout    time.Duration // per request
}

// orderIDs are the Idempotency-Keys of the storm's orders.
func (c stormConfig) orderIDs() []string {
	ids := make([]string, c.Orders)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-order-%03d", c.RunID, i+1)
	}
	return ids
}

// stormResult is what the client saw: responses by status, and errors.
type stormResult struct {
	Config   stormConfig
	Statuses map[int]int
	Errors   int
	Elapsed  time.Duration
	Ledger   LedgerStats // filled in by the caller from the backend
	FirstErr string
}

// Requests is the number of requests sent.
func (r stormResult) Requests() int { return r.Config.Orders * r.Config.Duplicates }

// runStorm sends Duplicates concurrent charges for each of Orders orders,
// every request released at the same moment, and reports progress to
// progress as responses come in.
func runStorm(ctx context.Context, cfg stormConfig, progress *progressLine) stormResult {
	n := cfg.Orders * cfg.Duplicates
	client := &http.Client{
		Timeout: cfg.Timeout,
		// One connection per request: the duplicates really are concurrent.
		Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true},
	}
	defer client.CloseIdleConnections()

	type reply struct {
		status int
		err    error
	}
	replies := make(chan reply, n)
	start := make(chan struct{})
	var ready sync.WaitGroup
	for _, id := range cfg.orderIDs() {
		body, _ := json.Marshal(chargeRequest{OrderID: id, AmountCents: 1299})
		for range cfg.Duplicates {
			ready.Add(1)
			go func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
				if err != nil {
					ready.Done()
					replies <- reply{err: err}
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", id)
				ready.Done()
				<-start
				resp, err := client.Do(req)
				if err != nil {
					replies <- reply{err: err}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				replies <- reply{status: resp.StatusCode}
			}()
		}
	}
	ready.Wait()
	began := time.Now()
	close(start)

	res := stormResult{Config: cfg, Statuses: make(map[int]int)}
	var done atomic.Int64
	stop := progress.Track(cfg.Name, n, &done)
	for range n {
		r := <-replies
		done.Add(1)
		if r.err != nil {
			res.Errors++
			if res.FirstErr == "" {
				res.FirstErr = r.err.Error()
			}
			continue
		}
		res.Statuses[r.status]++
	}
	res.Elapsed = time.Since(began)
	stop()
	return res
}

// progressLine shows how many responses a storm has had: one line redrawn
// in place on a terminal, a plain line now and then otherwise (logs, CI).
type progressLine struct {
	Out      io.Writer
	Terminal bool
	Every    time.Duration // redraw interval on a terminal
}

// newProgressLine redraws in place only when out is a terminal.
func newProgressLine(out io.Writer) *progressLine {
	term := false
	if f, ok := out.(*os.File); ok {
		st, err := f.Stat()
		term = err == nil && st.Mode()&os.ModeCharDevice != 0
	}
	return &progressLine{Out: out, Terminal: term, Every: 50 * time.Millisecond}
}

// Track reports done/total for name until the returned stop is called.
func (p *progressLine) Track(name string, total int, done *atomic.Int64) (stop func()) {
	every := p.Every
	if !p.Terminal {
		every = time.Second
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	draw := func(final bool) {
		d := int(done.Load())
		if p.Terminal {
			bar := strings.Repeat("#", d*30/max(total, 1)) + strings.Repeat(".", 30-d*30/max(total, 1))
			fmt.Fprintf(p.Out, "\r  %-20s [%s] %d/%d responses %5.1fs", name, bar, d, total, time.Since(start).Seconds())
			if final {
				fmt.Fprintln(p.Out)
			}
			return
		}
		fmt.Fprintf(p.Out, "  %s: %d/%d responses after %.1fs\n", name, d, total, time.Since(start).Seconds())
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		if p.Terminal {
			draw(false)
		}
		for {
			select {
			case <-quit:
				draw(true)
				return
			case <-t.C:
				draw(false)
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// statusText lists response counts by status: "200 x20, 409 x180".
func (r stormResult) statusText() string {
	codes := make([]int, 0, len(r.Statuses))
	for c := range r.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, 0, len(codes)+1)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d %s x%d", c, http.StatusText(c), r.Statuses[c]))
	}
	if r.Errors > 0 {
		parts = append(parts, fmt.Sprintf("transport errors x%d (first: %s)", r.Errors, r.FirstErr))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

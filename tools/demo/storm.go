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

// stormConfig is one route's traffic: the storm of duplicate charges and,
// after it, the late retries.
type stormConfig struct {
	Name       string // route name in the report
	URL        string // POST target
	RunID      string // keeps order ids apart between routes and runs
	Orders     int
	Duplicates int           // storm requests per order, all sent at once
	Retries    int           // late retries per order, one after another
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

// chargeBody is the JSON body of every charge for order id: a retry sends
// the very same bytes, as an SDK does.
func chargeBody(id string) []byte {
	body, _ := json.Marshal(chargeRequest{OrderID: id, AmountCents: 1299})
	return body
}

// responses is what the client saw of one wave of requests: answers by
// status, replays among them, and errors.
type responses struct {
	Sent     int
	Statuses map[int]int
	Replayed int // answers with Idempotent-Replayed: true (their status is in Statuses too)
	Errors   int
	Elapsed  time.Duration
	FirstErr string
}

// onlyOKOrConflict reports whether every request was answered, with 200
// (a charge, or the replay of one) or 409.
func (r responses) onlyOKOrConflict() bool {
	return r.Errors == 0 && r.Statuses[200]+r.Statuses[409] == r.Sent
}

// reply is one request's answer.
type reply struct {
	status   int
	replayed bool
	err      error
}

// chargeClient sends up to n requests at once, each on its own connection.
func chargeClient(n int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true},
	}
}

// newCharge is a charge request for order id, as every client sends it.
func newCharge(ctx context.Context, url, id string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(chargeBody(id)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	return req, nil
}

// send sends req and reads its answer to the end.
func send(client *http.Client, req *http.Request) reply {
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return reply{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
}

// collect counts n replies, reporting progress as they come in.
func collect(name string, n int, replies <-chan reply, began time.Time, progress *progressLine) responses {
	res := responses{Sent: n, Statuses: make(map[int]int)}
	var done atomic.Int64
	stop := progress.Track(name, n, &done)
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
		if r.replayed {
			res.Replayed++
		}
	}
	res.Elapsed = time.Since(began)
	stop()
	return res
}

// runStorm sends Duplicates concurrent charges for each of Orders orders,
// every request released at the same moment, and reports progress to
// progress as responses come in.
func runStorm(ctx context.Context, cfg stormConfig, progress *progressLine) responses {
	n := cfg.Orders * cfg.Duplicates
	// One connection per request: the duplicates really are concurrent.
	client := chargeClient(n, cfg.Timeout)
	defer client.CloseIdleConnections()

	replies := make(chan reply, n)
	start := make(chan struct{})
	var ready sync.WaitGroup
	for _, id := range cfg.orderIDs() {
		for range cfg.Duplicates {
			ready.Add(1)
			go func() {
				req, err := newCharge(ctx, cfg.URL, id)
				ready.Done()
				if err != nil {
					replies <- reply{err: err}
					return
				}
				<-start
				replies <- send(client, req)
			}()
		}
	}
	ready.Wait()
	began := time.Now()
	close(start)
	return collect(cfg.Name+", storm", n, replies, began, progress)
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
			bar := strings.Repeat("#", d*16/max(total, 1)) + strings.Repeat(".", 16-d*16/max(total, 1))
			fmt.Fprintf(p.Out, "\r  %-30s [%s] %d/%d responses %5.1fs", name, bar, d, total, time.Since(start).Seconds())
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

// statusText lists response counts by status: "200 OK x20, 409 Conflict
// x180", and the replays among them.
func (r responses) statusText() string {
	codes := make([]int, 0, len(r.Statuses))
	for c := range r.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, 0, len(codes)+2)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d %s x%d", c, http.StatusText(c), r.Statuses[c]))
	}
	if r.Replayed > 0 {
		parts = append(parts, fmt.Sprintf("%d of them replayed (Idempotent-Replayed: true)", r.Replayed))
	}
	if r.Errors > 0 {
		parts = append(parts, fmt.Sprintf("transport errors x%d (first: %s)", r.Errors, r.FirstErr))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

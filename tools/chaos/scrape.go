package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// scrapeMetrics writes node 0's /metrics (its admin endpoint) to path
// twice a second until stop closes, each scrape after a line "# scrape
// <seconds since t0>"; a scrape that fails (the node killed) is skipped.
func scrapeMetrics(path, admin string, t0 time.Time, stop <-chan struct{}) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return errors.Join(w.Flush(), f.Close())
		case <-tick.C:
		}
		resp, err := client.Get("http://" + admin + "/metrics")
		if err != nil {
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			continue
		}
		fmt.Fprintf(w, "# scrape %.2f\n", time.Since(t0).Seconds())
		w.Write(body)
	}
}

// appendFaults adds the faults' start times to the scrape file.
func appendFaults(path string, t0 time.Time, faults []faultEvent) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	for _, ev := range faults {
		fmt.Fprintf(f, "# fault %.2f %s\n", ev.Start.Sub(t0).Seconds(), ev.Kind)
	}
	return f.Close()
}

package main

import (
	"fmt"
	"net/http"
)

// refusedDuring is what the clients got while f lasted, for the summary's
// fault lines: the attempts the plugin answered 503 (unavailable: Redis
// did not take the key within the request's deadline), and those the
// backend did, among the attempts in flight from its start to its return
// (a fault with no return: its start).
func refusedDuring(rec runRecord, f faultEvent) string {
	end := f.Return
	if end.IsZero() {
		end = f.Start
	}
	during, refused, backend := 0, 0, 0
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			if a.Start.After(end) || a.End.Before(f.Start) {
				continue
			}
			during++
			switch {
			case a.Err != "" || a.Status != http.StatusServiceUnavailable:
			case a.Problem == "unavailable":
				refused++
			default:
				backend++
			}
		}
	}
	return fmt.Sprintf("503 unavailable x%d (and the backend's x%d) of %d attempts in flight", refused, backend, during)
}

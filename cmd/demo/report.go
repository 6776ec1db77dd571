package main

import (
	"fmt"
	"io"
)

// writeReport prints what each route did, then one summary line per route:
//
//	plain reverse_proxy: 200 requests, 20 orders, 180 double charges
//	redis_lock:          200 requests, 20 orders, 0 double charges, 180 rejected with 409
func writeReport(out io.Writer, o outcome) {
	for _, r := range []stormResult{o.Plain, o.Locked} {
		fmt.Fprintf(out, "%s (%s, %.2fs)\n", r.Config.Name, r.Config.URL, r.Elapsed.Seconds())
		fmt.Fprintf(out, "  responses: %s\n", r.statusText())
		l := r.Ledger
		fmt.Fprintf(out, "  ledger:    %d orders, %d charges, %d double charges", l.Orders, l.Charges, l.DoubleCharges)
		if l.StaleFences > 0 {
			fmt.Fprintf(out, ", %d stale fencing tokens rejected", l.StaleFences)
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
	if o.ok() {
		fmt.Fprintln(out, "redis_lock let one charge per order through; its duplicates got 409 Conflict.")
	} else {
		fmt.Fprintln(out, "FAIL: the redis_lock route let a double charge through or answered other than 200/409.")
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, summaryLine(o.Plain, false))
	fmt.Fprintln(out, summaryLine(o.Locked, true))
}

// summaryLine is the one-line result of a route, padded so both align.
func summaryLine(r stormResult, locked bool) string {
	s := fmt.Sprintf("%-21s%d requests, %d orders, %d double charges",
		r.Config.Name+":", r.Requests(), r.Ledger.Orders, r.Ledger.DoubleCharges)
	if locked {
		s += fmt.Sprintf(", %d rejected with 409", r.Statuses[409])
	}
	return s
}

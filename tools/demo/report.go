package main

import (
	"fmt"
	"io"
)

// writeReport prints what each route did, then one summary line per route:
//
//	plain reverse_proxy:       200 requests + 60 late retries, 20 orders, 240 double charges
//	redis_lock:                200 requests + 60 late retries, 20 orders, 60 double charges, 180 rejected with 409
//	redis_lock + idempotency:  200 requests + 60 late retries, 20 orders, 0 double charges, 180 rejected with 409, 60 replayed
func writeReport(out io.Writer, o outcome) {
	for _, r := range []routeResult{o.Plain, o.Locked, o.Idempotent} {
		fmt.Fprintf(out, "%s (%s)\n", r.Config.Name, r.Config.URL)
		fmt.Fprintf(out, "  storm:        %d requests in %.2fs: %s\n", r.Storm.Sent, r.Storm.Elapsed.Seconds(), r.Storm.statusText())
		if r.Late.Sent > 0 {
			fmt.Fprintf(out, "  late retries: %d requests in %.2fs: %s\n", r.Late.Sent, r.Late.Elapsed.Seconds(), r.Late.statusText())
		}
		l := r.Ledger
		fmt.Fprintf(out, "  ledger:       %d orders, %d charges, %d double charges", l.Orders, l.Charges, l.DoubleCharges)
		if late := l.DoubleCharges - r.StormLedger.DoubleCharges; late > 0 {
			fmt.Fprintf(out, " (%d in the storm, %d from late retries)", r.StormLedger.DoubleCharges, late)
		}
		if l.StaleFences > 0 {
			fmt.Fprintf(out, ", %d stale fencing tokens rejected", l.StaleFences)
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
	if o.ok() {
		fmt.Fprintln(out, "redis_lock let one charge per order through the storm; its duplicates got 409 Conflict.")
		if late := o.Locked.Ledger.DoubleCharges - o.Locked.StormLedger.DoubleCharges; late > 0 {
			fmt.Fprintf(out, "But the lock only serialises: %d late retries, sent after the first charge had finished, were charged again.\n", late)
		}
		if o.Idempotent.Late.Replayed > 0 {
			fmt.Fprintf(out, "With idempotency, %d late retries got the stored answer (Idempotent-Replayed: true) and never reached the backend.\n",
				o.Idempotent.Late.Replayed)
		}
	} else {
		fmt.Fprintln(out, "FAIL: redis_lock let a double charge through the storm, redis_lock + idempotency let one through at all,")
		fmt.Fprintln(out, "or one of them answered other than 200/409.")
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, summaryLine(o.Plain))
	fmt.Fprintln(out, summaryLine(o.Locked)+fmt.Sprintf(", %d rejected with 409", o.Locked.Status(409)))
	fmt.Fprintln(out, summaryLine(o.Idempotent)+fmt.Sprintf(", %d rejected with 409, %d replayed",
		o.Idempotent.Status(409), o.Idempotent.Replayed()))
}

// summaryLine is the start of a route's one-line result, padded so that
// the three align.
func summaryLine(r routeResult) string {
	return fmt.Sprintf("%-27s%d requests + %d late retries, %d orders, %d double charges",
		r.Config.Name+":", r.Storm.Sent, r.Late.Sent, r.Ledger.Orders, r.Ledger.DoubleCharges)
}

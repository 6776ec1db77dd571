package main

import (
	"context"
	"sync"
	"time"
)

// runLateRetries sends, once the storm has been answered, Retries more
// charges for each order with the same Idempotency-Key and the same body:
// what an SDK sends after a timeout. Each order's retries go one after
// another, each when the one before has been answered, so none of them
// overlaps another request for its order; the orders retry side by side.
func runLateRetries(ctx context.Context, cfg stormConfig, progress *progressLine) responses {
	n := cfg.Orders * cfg.Retries
	client := chargeClient(cfg.Orders, cfg.Timeout)
	defer client.CloseIdleConnections()

	replies := make(chan reply, n)
	began := time.Now()
	var wg sync.WaitGroup
	for _, id := range cfg.orderIDs() {
		wg.Go(func() {
			for range cfg.Retries {
				req, err := newCharge(ctx, cfg.URL, id)
				if err != nil {
					replies <- reply{err: err}
					continue
				}
				replies <- send(client, req)
			}
		})
	}
	res := collect(cfg.Name+", late", n, replies, began, progress)
	wg.Wait()
	return res
}

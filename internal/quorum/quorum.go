// Package quorum calls every master of a Redlock at once and returns as
// soon as a majority succeeded: a master that hangs does not hold the
// caller, and its call is not cut short either.
package quorum

import "context"

// Call runs f on masters 0..n-1 at once, with ctx, and returns once need of
// them returned ok (oks >= need) or once all returned; errs are the calls'
// errors so far. Calls still running when it returns go on; cancel, which
// ends ctx, is called once the last has returned.
func Call(ctx context.Context, cancel context.CancelFunc, n, need int, f func(ctx context.Context, i int) (ok bool, err error)) (oks int, errs []error) {
	return call(ctx, cancel, n, need, n, f)
}

// CallOrGiveUp is Call that also returns as soon as more than n-need calls
// failed (returned an error), when need of them can no longer succeed.
func CallOrGiveUp(ctx context.Context, cancel context.CancelFunc, n, need int, f func(ctx context.Context, i int) (ok bool, err error)) (oks int, errs []error) {
	return call(ctx, cancel, n, need, n-need, f)
}

// call is Call that returns once more than maxErrs calls failed too.
func call(ctx context.Context, cancel context.CancelFunc, n, need, maxErrs int, f func(ctx context.Context, i int) (ok bool, err error)) (oks int, errs []error) {
	type result struct {
		ok  bool
		err error
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			ok, err := f(ctx, i)
			results <- result{ok, err}
		}()
	}
	for i := range n {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err)
		} else if r.ok {
			oks++
		}
		if oks >= need || len(errs) > maxErrs {
			go func() {
				for range n - i - 1 {
					<-results
				}
				cancel()
			}()
			return oks, errs
		}
	}
	cancel()
	return oks, errs
}

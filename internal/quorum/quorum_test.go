package quorum

import (
	"context"
	"errors"
	"testing"
)

// Call returns once a majority succeeded, while a call still hangs, and
// ends the context only after that call returned.
func TestCallReturnsAtMajority(t *testing.T) {
	hang := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	oks, errs := Call(ctx, cancel, 3, 2, func(ctx context.Context, i int) (bool, error) {
		if i == 2 {
			<-hang
			return true, ctx.Err()
		}
		return true, nil
	})
	if oks != 2 || len(errs) != 0 {
		t.Fatalf("oks %d, errs %v; want 2 and none", oks, errs)
	}
	if ctx.Err() != nil {
		t.Fatal("the context ended while a call was still running")
	}
	close(hang)
	<-ctx.Done()
}

// Without a majority Call waits for every call and returns their errors.
func TestCallWithoutMajority(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	boom := errors.New("boom")
	oks, errs := Call(ctx, cancel, 3, 2, func(_ context.Context, i int) (bool, error) {
		switch i {
		case 0:
			return true, nil
		case 1:
			return false, nil
		}
		return false, boom
	})
	if oks != 1 || len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Fatalf("oks %d, errs %v; want 1 and boom", oks, errs)
	}
	if ctx.Err() == nil {
		t.Fatal("the context was not ended")
	}
}

// CallOrGiveUp returns once too many calls failed for a majority, while a
// call still hangs, and ends the context only after that call returned.
func TestCallOrGiveUpReturnsWithoutMajority(t *testing.T) {
	hang := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	boom := errors.New("boom")
	oks, errs := CallOrGiveUp(ctx, cancel, 3, 2, func(ctx context.Context, i int) (bool, error) {
		if i == 2 {
			<-hang
			return true, ctx.Err()
		}
		return false, boom
	})
	if oks != 0 || len(errs) != 2 {
		t.Fatalf("oks %d, errs %v; want 0 and two", oks, errs)
	}
	if ctx.Err() != nil {
		t.Fatal("the context ended while a call was still running")
	}
	close(hang)
	<-ctx.Done()
}

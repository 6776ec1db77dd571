package redislock

import (
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/caddy-redis-lock/internal/redistest"
	"github.com/reqlock/caddy-redis-lock/record"
)

// An answer given while Redis was down is stored as soon as Redis is back,
// with its tries 25ms apart and woken when Redis answers again: before
// that, a retry on another node could run the request again. Redis is
// killed while the backend runs and restarted from its AOF with the lock
// still on its lease; a retry after the store gets the answer. (That the
// probe's connect wakes the tries is TestRedialAfterRestartWithinBound's.)
func TestAnswerStoredAsRedisComesBack(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	be := chargeBackend(t)
	s := startCaddySite(t, paySite(srv.Addr, be.hostPort(), faultTimeouts, idempotent()), siteOptions{})
	var took []time.Duration
	for i := range 5 {
		name := "back-" + string(rune('a'+i))
		done := make(chan *response, 1)
		go func() { done <- s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name) }()
		be.waitEntered(t, 5*time.Second)
		srv.Stop()
		first := <-done
		if first.Status != http.StatusOK {
			t.Fatalf("%s, answered while Redis was down: %s", name, first)
		}
		time.Sleep(700 * time.Millisecond) // the pool gives up dialling: its probe takes over
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		up := time.Now() // Restart returns once Redis answers a PING
		redistest.Eventually(t, 5*time.Second, name+"'s answer stored", func() bool {
			return keyExists(t, rdb, record.Key(defaultKey(name)))
		})
		took = append(took, time.Since(up))
		again := s.do("POST", "/pay/slow", `{}`, "Idempotency-Key", name)
		if again.Header.Get(replayedHeader) != "true" || again.Body != first.Body || be.executions(name) != 1 {
			t.Fatalf("%s, retried: %s, %d runs; want the first answer replayed", name, again, be.executions(name))
		}
	}
	slices.Sort(took)
	t.Logf("answers stored after Redis answered again: %v", took)
	// A redial interval (the probe's), a connect and a round trip; with
	// tries that backed off to 200ms apart and no wake-up, the median was
	// 174ms.
	if median := took[len(took)/2]; median > 75*time.Millisecond {
		t.Fatalf("median %v from Redis's return to the answer stored, want at most 75ms (tries woken when Redis is back)", median)
	}
}

// A server is back when a command succeeds after a failure to reach it;
// Redis's own error replies are answers, and successes alone wake nothing.
func TestServerHealthTellsBack(t *testing.T) {
	b := newRedisBack()
	s := serverHealth{b: b}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	ch := b.next()
	s.report(nil)
	s.report(replyError("NOSCRIPT No matching script")) // Redis answered
	s.report(nil)
	if closed(ch) {
		t.Fatal("woken with no failure before")
	}
	s.report(errors.New("dial tcp: connection refused"))
	s.report(errors.New("i/o timeout"))
	if closed(ch) {
		t.Fatal("woken by a failure")
	}
	s.report(replyError("LOADING Redis is loading the dataset in memory"))
	if closed(ch) {
		t.Fatal("woken by a server still loading its data")
	}
	s.report(replyError("NOSCRIPT No matching script"))
	if !closed(ch) {
		t.Fatal("an answer after a failure woke nothing")
	}
	next := b.next()
	s.report(nil)
	if closed(next) {
		t.Fatal("woken again with no failure in between")
	}
	start := time.Now()
	if waitOrBack(next, 50*time.Millisecond) {
		t.Fatal("woken with nothing closed")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("waited %v with no wake-up, want its 50ms", d)
	}
}

// replyError is an error reply of Redis, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

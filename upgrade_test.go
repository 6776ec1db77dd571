package redislock

// What a node does with a stored answer whose record format version it
// does not know, as during an upgrade of nodes that share one Redis
// (docs/operations.md): its retry is answered 503 (fail_closed) or passed
// on unlocked (fail_open), and the admin API shows the record as
// unreadable.

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/reqlock/caddy-redis-lock/record"
)

// recordVersionAt is the offset of the format version in a completed
// record: 'C', then the 64 hex digits of the fingerprint.
const recordVersionAt = 1 + 64

func TestRecordOfAnotherFormatVersion(t *testing.T) {
	t.Parallel()
	srv, rdb := newRedis(t)
	be := chargeBackend(t)
	site := func(path, onError string) string {
		return fmt.Sprintf(`	redis_lock %s* {http.request.header.Idempotency-Key} {
		name %s
		redis %s
		on_error %s
		idempotency
	}`, path, onError, srv.Addr, onError)
	}
	s := startCaddySite(t, site("/pay", "fail_closed")+"\n"+site("/open", "fail_open")+
		"\n\treverse_proxy "+be.hostPort(), siteOptions{admin: true})
	ctx := context.Background()

	for _, c := range []struct {
		path, name, key string
		want            int // the retry's status once the record is of version 2
		runs            int // the backend's runs for the key, after the retry
	}{
		{"/pay", "fail_closed", "closed", http.StatusServiceUnavailable, 1},
		{"/open", "fail_open", "open", http.StatusCreated, 2},
	} {
		if r := s.do("POST", c.path, `{}`, "Idempotency-Key", c.key); r.Status != http.StatusCreated {
			t.Fatalf("%s: the first request: %s", c.path, r)
		}
		if r := s.do("POST", c.path, `{}`, "Idempotency-Key", c.key); r.Header.Get(replayedHeader) != "true" {
			t.Fatalf("%s: a retry of version 1: %s, want it replayed", c.path, r)
		}
		rkey := record.Key(defaultKey(c.key))
		v, err := rdb.GetRange(ctx, rkey, recordVersionAt, recordVersionAt).Result()
		if err != nil || v != "\x01" {
			t.Fatalf("%s: the record's format version: %q, %v; want 1", c.path, v, err)
		}
		if err := rdb.SetRange(ctx, rkey, recordVersionAt, "\x02").Err(); err != nil {
			t.Fatal(err)
		}
		r := s.do("POST", c.path, `{}`, "Idempotency-Key", c.key)
		if r.Status != c.want {
			t.Errorf("%s: a retry of a version 2 record: %s, want %d", c.path, r, c.want)
		}
		if n := be.executions(c.key); n != c.runs {
			t.Errorf("%s: the backend ran %d times, want %d", c.path, n, c.runs)
		}
		if st := s.lookup(keyQuery("key", c.key, "name", c.name)); st.Record.State != stateUnreadable {
			t.Errorf("%s: the admin API shows %+v, want %s", c.path, st.Record, stateUnreadable)
		}
	}
}

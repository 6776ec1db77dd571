package record

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/quorum"
	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// Errors of Begin, for errors.Is and errors.As.
var (
	// ErrMismatch: the key has a record of a request with another
	// fingerprint (the same key reused for a different request).
	ErrMismatch = errors.New("record: idempotency key reused with another request")
	// ErrAbandoned: the key's record is in progress and its lock is gone:
	// its holder's lease ran out before it stored an outcome or gave the
	// record back (the holder died, or was cut off from Redis). The
	// request may have run, so nobody runs it again: the record is kept
	// for its retention, until its holder stores the real outcome or an
	// operator removes it (Remove). In Redlock mode a majority of the
	// masters decides (it is an engine.ErrByMajority).
	ErrAbandoned error = abandonedError{}
	// ErrNotStored: Complete found the record no longer ours (its lease
	// ran out and another request took the key).
	ErrNotStored = errors.New("record: outcome not stored, the record is no longer ours")
	// ErrKeyHeld is the ErrNotStored of a Complete that found another
	// request holding the key, and wrote nothing: that request may still
	// give it up (one refused after a failover, say), and a Complete
	// tried again then stores the outcome.
	ErrKeyHeld = fmt.Errorf("%w: another request holds the key", ErrNotStored)
)

// abandonedError is ErrAbandoned: an answer a majority of Redlock's
// masters must give to decide a Begin.
type abandonedError struct{}

func (abandonedError) Error() string {
	return "record: the request's holder left it unfinished: its outcome is unknown"
}

func (abandonedError) Is(target error) bool { return target == engine.ErrByMajority }

// CompletedError is what Begin returns when the key's request has already
// completed with the same fingerprint: its stored Response.
type CompletedError struct{ Response *Response }

func (e *CompletedError) Error() string {
	return fmt.Sprintf("record: request already completed (status %d)", e.Response.Status)
}

// Key is the record's Redis key for a lock key: it keeps the lock's Cluster
// hash tag, so that one script can touch both.
func Key(lockKey string) string { return lockKey + ":result" }

// Store keeps records beside the locks of a Client: on one Redis deployment,
// or on every master of a Redlock, where a record is written to all of them
// and a completion counts once a majority has it.
type Store struct {
	c      *engine.Client
	nodes  []*engine.Redis
	names  []string
	quorum int
}

// NewStore returns the Store of c, whose Backend tells where its locks
// live (engine.Placed): a Redis, or a Redlock of them.
func NewStore(c *engine.Client) (*Store, error) {
	b, ok := c.Backend().(engine.Placed)
	if !ok {
		return nil, fmt.Errorf("record: a Store needs a Client on Redis or Redlock, not %T", c.Backend())
	}
	m := b.Masters()
	return &Store{c: c, nodes: m.Nodes, names: m.Names, quorum: m.Quorum}, nil
}

// Pending is a request that runs with its record in progress: its held
// lock, and the fingerprint that its outcome is stored with. It is what
// Begin gives and what Complete or Release ends: Release gives the request
// up with nothing to keep (the backend was never reached, or answered "try
// again"), deleting the lock and the record in progress, so that a retry
// runs. A Pending that is neither completed nor released (its process
// died) leaves its record abandoned once its lease runs out (ErrAbandoned).
type Pending struct {
	*engine.Lock
	store       *Store
	fingerprint string
	// The last response Complete encoded, and its bytes: a completion that
	// Redis does not take is tried again with the same one every 25ms,
	// and a 1 MiB answer must not cost 1 MiB a try.
	encoded []byte
	of      *Response
}

// Begin starts the request with fingerprint under key (a lock key), in one
// round trip. When the request is new, it returns it Pending: the lock
// held, the record in progress beside it, kept for retention (at least the
// lease) unless Complete or Release ends it. Otherwise it returns a
// *CompletedError with the stored response, ErrMismatch when the key's
// record has another fingerprint, ErrAbandoned when its holder left it
// unfinished, or a *engine.NotObtainedError while another request with the
// same fingerprint is in progress (after opt.Wait, during which a
// completion ends the wait with its response, and a lease that runs out
// with ErrAbandoned). fingerprint is 64 hex digits (a SHA-256).
func (s *Store) Begin(ctx context.Context, key, fingerprint string, retention time.Duration, opt engine.Options) (*Pending, error) {
	if len(fingerprint) != fingerprintLen {
		return nil, fmt.Errorf("record: fingerprint of %d characters, want %d", len(fingerprint), fingerprintLen)
	}
	ttl := opt.TTL
	if ttl <= 0 {
		ttl = engine.DefaultTTL
	}
	keep := max(retention, ttl).Milliseconds()
	var b engine.Backend
	if len(s.nodes) == 1 {
		b = &begin{node: s.nodes[0], fingerprint: fingerprint, keep: keep}
	} else {
		nodes := make([]engine.Master, len(s.nodes))
		for i, n := range s.nodes {
			nodes[i] = &begin{node: n, fingerprint: fingerprint, keep: keep}
		}
		rl, err := engine.NewRedlockOf(nodes, s.names)
		if err != nil {
			return nil, err
		}
		b = rl
	}
	lk, err := s.c.AcquireWith(ctx, b, key, opt)
	if err != nil {
		return nil, err
	}
	return &Pending{Lock: lk, store: s, fingerprint: fingerprint}, nil
}

// Complete stores resp as the outcome of p's request for retention and
// releases p's lock. Like a release it runs detached from ctx's
// cancellation, bounded by the Client's ReleaseTimeout, and for a Bulk
// answer by the time its size takes on a slow link too (tryTimeout). The
// lock's keep-alive goes on while Redis has not answered (engine.Ending), so
// that the lease outlasts a large answer on its way, and stops once it
// has; after an ErrUnavailable error it still goes on, for the tries that
// follow: call Complete again, or Stop or Release to give the lock up.
//
// It returns ErrNotStored when the outcome was not stored: another was
// stored first, or p's lease ran out and another request has taken the key
// since (a holder whose lease ran out never overwrites or pre-empts a later
// one's).
// It returns an ErrUnavailable error when Redis did not answer, and an
// ErrNotReplicated one when the outcome is stored but fewer replicas than
// the backend waits for acknowledged it in time (a failover may lose it:
// call Complete again until it returns nil, while the lease lasts).
//
// It is one script (complete.lua), checked where it runs: while the record
// is still p's in progress (or gone, and no other request holds the key),
// SET stores the outcome over it, then HDEL releases the lock's token. The
// record stays p's past its lease, since no other request begins over it
// (ErrAbandoned), so the outcome of a holder that comes back late still
// replaces the abandoned record: its retries were told the outcome is
// unknown, which was true, and from then on get the real one. The check is made by Redis when the
// script runs, not by the caller when it sends it: a command may reach
// Redis long after it was sent (a Redis paused past the lease runs what
// waited in its socket buffers when it resumes, its clock past the lease),
// so no local deadline can tell that unchecked commands would still be
// safe. One command also keeps the completion in one round trip through
// the autopipeliner; a Bulk one goes on a connection of its own instead
// (redisscript's ProcessBulk), so that the renewals and other requests'
// commands are not queued behind its transfer. A Complete retried after a
// lost reply finds its own record and counts it as stored, so it may be
// called again after an ErrUnavailable error, one call at a time, with a
// resp left unchanged (its encoding is kept for the next call).
//
// In Redlock mode a completion whose lock is held on a majority by its own
// clock (mayBeLost) is written over a competing begin's record in progress
// on a master where that begin holds the lock, so that it is on every
// master; a completed record is never written over.
func (p *Pending) Complete(ctx context.Context, resp *Response, retention time.Duration) error {
	s, lk := p.store, p.Lock
	if p.of != resp {
		p.encoded, p.of = encode(p.fingerprint, resp), resp
	}
	c := completion{value: p.encoded, retention: retention, bulk: Bulk(resp)}
	timeout := s.tryTimeout(c.bulk, len(c.value))
	c.majority = len(s.nodes) > 1 && !s.mayBeLost(lk, timeout)
	lk.Ending()
	rctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if timeout > 0 {
		rctx, cancel = context.WithTimeout(rctx, timeout)
	}
	err := s.complete(rctx, cancel, lk, c)
	if !errors.Is(err, engine.ErrUnavailable) {
		lk.Stop() // Redis answered: the lock is deleted, or not ours
	}
	return err
}

// completion is what one try of Complete writes, and how.
type completion struct {
	value     []byte
	retention time.Duration
	bulk      bool // on a connection of its own (Bulk)
	majority  bool // held on a majority of Redlock's masters: over a competing begin's record
}

// complete is one try of Complete on ctx, which cancel ends.
func (s *Store) complete(ctx context.Context, cancel context.CancelFunc, lk *engine.Lock, c completion) error {
	if len(s.nodes) == 1 {
		defer cancel()
		stored, err := s.completeOn(ctx, 0, lk, &c)
		switch {
		case errors.Is(err, errHeld):
			return ErrKeyHeld
		case err != nil && !redisscript.Unreplicated(err):
			return fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
		case !stored:
			return ErrNotStored
		case err != nil:
			return fmt.Errorf("record: outcome stored on the primary, %w", err)
		}
		return nil
	}
	// Stored as soon as a majority stored it: a Redlock master that hangs
	// does not hold the response. The other masters' writes go on until
	// they answer or the try's bound passes.
	rc := c // the closure's, on the heap: not the single node's
	stored, errs := quorum.Call(ctx, cancel, len(s.nodes), s.quorum, func(ctx context.Context, i int) (bool, error) {
		ok, err := s.completeOn(ctx, i, lk, &rc)
		if errors.Is(err, errHeld) {
			err = nil // a refusal, as a record of another's
		}
		return ok, err
	})
	if stored >= s.quorum {
		return nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: stored on %d of %d: %w", engine.ErrUnavailable, stored, len(s.nodes), errors.Join(errs...))
	}
	return ErrNotStored
}

// BulkSize is the size from which an answer is Bulk.
const BulkSize = 16 << 10

// Bulk reports whether resp's completion is a bulk one: an answer of
// BulkSize bytes or more, which Complete sends on a connection of its own,
// with a bound of its size. Below it, a completion is one command among
// the others of the autopipeliner, as cheap as a release.
func Bulk(resp *Response) bool { return resp.Size() >= BulkSize }

// bulkRate is the slowest link a bulk completion waits for, in bytes a
// second: 160 KiB get 5s more than ReleaseTimeout.
const bulkRate = 32 << 10

// maxBulkTimeout caps a bulk completion's try: the key stays in progress
// (409) meanwhile, and the answer is given up past it (the handler stores
// outcome-unknown in its place).
const maxBulkTimeout = 10 * time.Second

// tryTimeout bounds one try of a completion of size bytes: the Client's
// ReleaseTimeout (0: none), and for a bulk one the time its size takes at
// bulkRate on top, at most maxBulkTimeout (or ReleaseTimeout when longer).
// A fixed bound cannot carry a large answer over a slow link (160 KiB at
// 96 KB/s take 1.7s), and every try cut at it sends the whole answer again;
// an unbounded one would hold a connection, and the key, for as long as a
// stalled link lasts. The lease is renewed on other connections meanwhile.
func (s *Store) tryTimeout(bulk bool, size int) time.Duration {
	rt := s.c.Config().ReleaseTimeout
	if !bulk {
		return rt
	}
	return min(rt+time.Duration(size)*time.Second/bulkRate, max(rt, maxBulkTimeout))
}

// mayBeLost reports whether lk's outcome must be stored the checked way
// (complete.lua), the one place that decides it: when lk was lost (Redis
// reported another holder, or its local lease deadline passed unrenewed
// while it was kept alive), or when less than one call is left before its
// local lease deadline, or that deadline has passed. The deadline counts
// after Stop too: a Complete retried in the background may have a stopped
// lock (a lost lock's answer), whose Context says ErrReleased however long
// ago its lease ran out, and a holder past its lease must never store
// unchecked, since a later request may have taken the key and be running.
//
// The margin is one call, the Client's CallTimeout, or the try's own bound
// when longer (ReleaseTimeout, more for a Bulk answer): the native commands may reach Redis that long after
// they are issued (an attempt, then go-redis's retry on a new connection),
// and they are safe only if Redis runs them while the lease still holds
// there, which is at or after the local deadline. A smaller margin (the
// lease's own, for clock drift) would let a command sent just before the
// deadline land after it. The price is a script instead of two native
// commands for a request that completes within a call of its deadline,
// which renewal (every ttl/3) keeps rare unless ttl is under about 1.5
// times CallTimeout. With neither timeout set the margin is 0.
func (s *Store) mayBeLost(lk *engine.Lock, try time.Duration) bool {
	if errors.Is(context.Cause(lk.Context()), engine.ErrNotHeld) {
		return true
	}
	margin := max(s.c.Config().CallTimeout, try)
	return time.Until(lk.Deadline()) <= margin
}

// completeOn stores c's value as lk's record on node i and releases lk
// there, with complete.lua; it reports whether the record is lk's (stored
// now or by an earlier try).
func (s *Store) completeOn(ctx context.Context, i int, lk *engine.Lock, c *completion) (bool, error) {
	conn := s.nodes[i].Conn()
	run := conn.Run
	if c.bulk {
		run = conn.RunBulk
	}
	majority := "0"
	if c.majority {
		majority = "1"
	}
	cmd, err := run(ctx, completeScript, []string{lk.Key(), Key(lk.Key())}, lk.Token(), c.retention.Milliseconds(), c.value, majority)
	if err != nil && !redisscript.Unreplicated(err) {
		return false, &engine.NodeError{Node: s.names[i], Err: err}
	}
	v, _ := cmd.Int64()
	if v == 2 { // nothing written: what the replicas say does not matter
		err = errHeld
	}
	return v == 1, err
}

// errHeld is completeOn's report of a key another request holds.
var errHeld = errors.New("held by another request")

// begin is the Backend of one Begin on one Redis: the lock taken with the
// record, and refreshed and released with it.
type begin struct {
	node        *engine.Redis
	fingerprint string
	keep        int64 // how long the record in progress lasts, in ms: the retention
}

func (b *begin) TryAcquire(ctx context.Context, key, token string, ttl time.Duration) (int64, error) {
	conn := b.node.Conn()
	args := []any{token, ttl.Milliseconds(), b.fingerprint, conn.Deadline(ctx), b.keep}
	if engine.Waiting(ctx) {
		args = append(args, "1")
	}
	cmd, err := conn.Run(ctx, beginScript, []string{key, engine.CounterKey(key), Key(key), engine.GoneKey(key, token)}, args...)
	if err != nil && !redisscript.Unreplicated(err) {
		return 0, redisscript.Classify(ctx, conn.Late(err))
	}
	// A stored answer or a mismatch wrote nothing: what the replicas
	// acknowledged does not matter to it (Grant decides for a grant).
	if v, ok := cmd.Val().(string); ok && v != "" {
		switch v[0] {
		case 'M':
			return 0, ErrMismatch
		case 'A':
			return 0, ErrAbandoned
		case 'C':
			_, resp, err := decode([]byte(v))
			if err != nil {
				return 0, err
			}
			return 0, &CompletedError{Response: resp}
		}
	}
	return conn.Grant(ctx, cmd, err, notObtained)
}

// Refresh is the lock's: the record in progress lasts its retention.
func (b *begin) Refresh(ctx context.Context, key, token string, ttl time.Duration) error {
	return b.node.Refresh(ctx, key, token, ttl)
}

// Release gives the request up (Pending.Release): its record in progress
// deleted and its lock released, if they are still this holder's
// (release.lua).
func (b *begin) Release(ctx context.Context, key, token string) error {
	return giveUp(ctx, b.node, []string{key, Key(key)}, token)
}

// GiveBack is Release for a Begin that did not answer in time, and may
// still run: it also marks the token given back (engine.GoneKey) for a
// lease, so that a Begin that runs later takes nothing.
func (b *begin) GiveBack(ctx context.Context, key, token string, ttl time.Duration) error {
	return giveUp(ctx, b.node, []string{key, Key(key), engine.GoneKey(key, token)}, token, max(ttl.Milliseconds(), 1))
}

// GiveBackFor is how long a give-back that Redis did not take is tried
// again: with `replicas`, as long as an answer the replicas did not
// acknowledge (a failover's detection takes Sentinel's or the Cluster's
// timeout, 15s to 30s by default), since a record in progress the new
// primary keeps is abandoned there; else the engine's own bound.
func (b *begin) GiveBackFor() time.Duration {
	if b.node.Conn().Replicas() > 0 {
		return UnackedRetryFor
	}
	return 0
}

// UnackedRetryFor is how long a write to a record that the replicas did not
// acknowledge is tried again (`replicas`): through a failover, whose
// detection alone takes Sentinel's down-after-milliseconds (30s by
// default) or a Cluster's cluster-node-timeout (15s).
const UnackedRetryFor = 2 * time.Minute

// WatchRelease is the lock's: a completion publishes as a release does.
func (b *begin) WatchRelease(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return b.node.WatchRelease(ctx, key)
}

// RaiseFence lets a Redlock write its winning token back to this master.
func (b *begin) RaiseFence(ctx context.Context, key string, fence int64) error {
	return b.node.RaiseFence(ctx, key, fence)
}

// Node is the Redis the record and its lock live on.
func (b *begin) Node() *engine.Redis { return b.node }

var _ engine.Master = (*begin)(nil)

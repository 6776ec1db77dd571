package record

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/reqlock/caddy-redis-lock/internal/engine"
	"github.com/reqlock/caddy-redis-lock/internal/redisscript"
)

// An operator's scripts: one round trip each, the lock and the record read
// or changed together (they share a slot, so this works in a Cluster too).
var (
	//go:embed inspect.lua
	inspectSrc    string
	inspectScript = redisscript.New(inspectSrc)

	//go:embed remove.lua
	removeSrc    string
	removeScript = redisscript.New(removeSrc)
)

// Errors of Remove, for errors.Is.
var (
	// ErrHeld: the key's lock is held (its request is in progress), and
	// nothing was removed (in Redlock mode: on that master).
	ErrHeld = errors.New("record: the key's lock is held: its request is in progress")
	// ErrNoRecord: the key has no record to remove.
	ErrNoRecord = errors.New("record: the key has no record")
)

// Inspection is what Redis holds for one key, as an operator looks it up.
type Inspection struct {
	// Held: a request holds the key's lock, with the fencing token Fence,
	// for LockTTL more.
	Held    bool
	Fence   int64
	LockTTL time.Duration
	// InProgress: the holder is a request whose outcome is to be stored
	// (Begin's lock, with the record in progress beside it).
	InProgress bool
	// Abandoned: the record is in progress and its holder's lock is gone
	// (ErrAbandoned): a retry is answered that its outcome is unknown
	// until its holder stores it or Remove removes it.
	Abandoned bool
	// Record is the stored outcome, nil when there is none; it expires in
	// RecordTTL.
	Record    *Response
	RecordTTL time.Duration
	// Unreadable: a record is there that this version cannot decode
	// (Record is nil); Remove removes it all the same.
	Unreadable bool

	holder string // the holder's token
}

// NodeInspection is one Redlock master's part of an Inspection.
type NodeInspection struct {
	Name string
	Inspection
	Err error // the master did not answer
}

// Inspect looks up the lock and the record of lockKey. In Redlock mode the
// answer is what a request with the key meets: the lock held when a
// majority of the masters hold it for one holder (its fencing token the
// largest they have, its TTL how long a majority keeps it), and the record
// that any master has, which a retry replays; nodes holds each master's
// own view. With one Redis, nodes is nil.
func (s *Store) Inspect(ctx context.Context, lockKey string) (Inspection, []NodeInspection, error) {
	if len(s.nodes) == 1 {
		in, err := inspectOn(ctx, s.nodes[0], lockKey)
		return in, nil, err
	}
	nodes := make([]NodeInspection, len(s.nodes))
	s.onEvery(func(i int, n *engine.Redis) {
		nodes[i].Name = s.names[i]
		nodes[i].Inspection, nodes[i].Err = inspectOn(ctx, n, lockKey)
	})
	in, err := s.summarise(nodes)
	return in, nodes, err
}

// onEvery runs f on every master at once and waits for them all.
func (s *Store) onEvery(f func(i int, n *engine.Redis)) {
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Go(func() { f(i, n) })
	}
	wg.Wait()
}

// summarise is the Redlock answer of Inspect from its masters' answers.
func (s *Store) summarise(nodes []NodeInspection) (Inspection, error) {
	var in Inspection
	var errs []error
	abandoned := 0
	for _, n := range nodes {
		if n.Err != nil {
			errs = append(errs, &engine.NodeError{Node: n.Name, Err: n.Err})
			continue
		}
		if n.Record != nil && (in.Record == nil || n.RecordTTL > in.RecordTTL) {
			in.Record, in.RecordTTL = n.Record, n.RecordTTL
		}
		in.Unreadable = in.Unreadable || n.Unreadable
		if n.Abandoned {
			abandoned++
		}
	}
	// A retry is refused as abandoned when a majority says so (Begin).
	in.Abandoned = in.Record == nil && abandoned >= s.quorum
	if in.Record != nil {
		in.Unreadable = false
	}
	if len(errs) > len(nodes)-s.quorum {
		return Inspection{}, fmt.Errorf("%w: no majority of the masters answered: %w", engine.ErrUnavailable, errors.Join(errs...))
	}
	// One holder's fencing token differs from master to master (each
	// issues its own, and the largest is written back to a majority), so
	// a holder is known by its token: group the masters by it.
	byHolder := map[string][]NodeInspection{}
	for _, n := range nodes {
		if n.Err == nil && n.Held {
			byHolder[n.holder] = append(byHolder[n.holder], n)
		}
	}
	for _, held := range byHolder {
		if len(held) < s.quorum {
			continue
		}
		slices.SortFunc(held, func(a, b NodeInspection) int { return cmp.Compare(b.LockTTL, a.LockTTL) })
		in.Held, in.LockTTL = true, held[s.quorum-1].LockTTL
		for _, n := range held {
			in.Fence = max(in.Fence, n.Fence)
			in.InProgress = in.InProgress || n.InProgress
		}
	}
	return in, nil
}

// inspectOn is Inspect on one Redis.
func inspectOn(ctx context.Context, n *engine.Redis, lockKey string) (Inspection, error) {
	cmd, err := n.Conn().Run(ctx, inspectScript, []string{lockKey, Key(lockKey)})
	if err != nil && !redisscript.Unreplicated(err) {
		return Inspection{}, redisscript.Classify(ctx, err)
	}
	reply, ok := cmd.Val().([]any)
	if !ok || len(reply) != 4 {
		return Inspection{}, fmt.Errorf("record: inspect: unexpected reply %v", cmd.Val())
	}
	var in Inspection
	fields, _ := reply[0].([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		val, _ := fields[i+1].(string)
		switch {
		case !strings.Contains(name, ":"): // the holder's token
			in.Held, in.holder = true, name
			in.Fence, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	if pttl, _ := reply[1].(int64); in.Held && pttl > 0 {
		in.LockTTL = time.Duration(pttl) * time.Millisecond
	}
	if v, ok := reply[2].(string); ok {
		if holder, ok := inProgress([]byte(v)); ok {
			in.InProgress = in.Held && holder == in.holder
			in.Abandoned = !in.Held
		} else if _, resp, err := decode([]byte(v)); err == nil {
			in.Record = resp
		} else {
			in.Unreadable = true
		}
		if pttl, _ := reply[3].(int64); pttl > 0 {
			in.RecordTTL = time.Duration(pttl) * time.Millisecond
		}
	}
	return in, nil
}

// Remove deletes the record of lockKey, so that the next request with the
// key runs again, and returns the outcome the record held. It
// never touches a held lock: while the key's lock is held it returns
// ErrHeld and deletes nothing. ErrNoRecord: there was nothing to remove.
// A record this version cannot read is removed too, with outcome 0.
// With a backend that waits for replicas, an error that matches
// engine.ErrNotReplicated comes with the outcome removed: removed on the
// primary, not acknowledged by the replicas in time (a failover may bring
// the record back, and with it the replays).
//
// In Redlock mode the record is removed from every master, since a retry
// replays a record that any master has: when one does not answer, nothing
// is removed and the error matches ErrUnavailable; when one holds the lock,
// nothing is removed either (ErrHeld). Should a master fail between the
// check and the removal, the others' records are gone: call Remove again.
func (s *Store) Remove(ctx context.Context, lockKey string) (Outcome, error) {
	if len(s.nodes) == 1 {
		return removeOn(ctx, s.nodes[0], lockKey)
	}
	// A request in progress holds the lock on some master: leave every
	// master's record alone, not only that master's.
	_, nodes, err := s.Inspect(ctx, lockKey)
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		if n.Err != nil {
			// Removed from the others, the record would still be
			// replayed once this master is back.
			return 0, fmt.Errorf("%w: master %s did not answer, nothing removed: %w", engine.ErrUnavailable, n.Name, n.Err)
		}
		if n.Held {
			return 0, ErrHeld
		}
	}
	type removed struct {
		outcome Outcome
		err     error
	}
	results := make([]removed, len(s.nodes))
	s.onEvery(func(i int, n *engine.Redis) {
		r := &results[i]
		r.outcome, r.err = removeOn(ctx, n, lockKey)
	})
	// A master may have changed between the check and the removal: say
	// what was removed where.
	var found *removed
	var gone, held []string
	var errs []error
	for i := range results {
		r := &results[i]
		switch {
		case r.err == nil:
			found = r
			gone = append(gone, s.names[i])
		case errors.Is(r.err, ErrHeld):
			held = append(held, s.names[i])
		case !errors.Is(r.err, ErrNoRecord):
			errs = append(errs, &engine.NodeError{Node: s.names[i], Err: r.err})
		}
	}
	switch {
	case len(held) > 0:
		return 0, fmt.Errorf("%w on master %s (removed on %d: %s)", ErrHeld, strings.Join(held, ", "), len(gone), strings.Join(gone, ", "))
	case len(errs) > 0:
		return 0, fmt.Errorf("removed on %d master(s) (%s): %w", len(gone), strings.Join(gone, ", "), errors.Join(errs...))
	case found == nil:
		return 0, ErrNoRecord
	}
	return found.outcome, nil
}

// removeOn is Remove on one Redis.
func removeOn(ctx context.Context, n *engine.Redis, lockKey string) (Outcome, error) {
	cmd, err := n.Conn().Run(ctx, removeScript, []string{lockKey, Key(lockKey)})
	if err != nil && !redisscript.Unreplicated(err) {
		return 0, redisscript.Classify(ctx, err)
	}
	head, _ := cmd.Val().(string)
	switch head {
	case "H":
		return 0, ErrHeld
	case "":
		return 0, ErrNoRecord
	}
	// Removed; err: not acknowledged by the replicas. A head this version
	// cannot read decodes as outcome 0: removed, its state unknown.
	outcome, _, _ := decodeHead([]byte(head))
	return outcome, err
}

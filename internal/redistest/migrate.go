package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// MigrateSlot moves slot to the master at to while the slot keeps serving,
// as `redis-cli --cluster reshard` does: CLUSTER SETSLOT IMPORTING on the
// target and MIGRATING on the source (StartMigration), then MIGRATE ...
// KEYS of batch keys at a time, pausing pause after each batch so that
// clients meet the slot split between the two nodes (ASK, TRYAGAIN), until
// the source has none left (MoveAll), then SETSLOT NODE on the target, the
// source and every other master (Finish). It returns the time the slot was
// split: from IMPORTING to the last SETSLOT NODE.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, to string, batch int, pause time.Duration) (time.Duration, error) {
	m, err := c.StartMigration(ctx, slot, to)
	if err != nil {
		return 0, err
	}
	if err := m.MoveAll(ctx, batch, pause); err != nil {
		return 0, err
	}
	return m.Finish(ctx)
}

// Migration is a slot being moved from one master to another.
type Migration struct {
	slot     string
	src, dst clusterNode
	masters  []clusterNode
	start    time.Time
}

// StartMigration marks slot importing on the master at to and migrating on
// the master that serves it: from then on the source runs a command only
// when it has all of its keys, answers ASK (go to the target) when it has
// none and TRYAGAIN when it has some, and the target runs a command sent
// after ASKING, but answers TRYAGAIN to one of several keys that lacks
// some of them.
func (c *Cluster) StartMigration(ctx context.Context, slot int, to string) (*Migration, error) {
	view, err := c.liveView()
	if err != nil {
		return nil, err
	}
	m := &Migration{slot: strconv.Itoa(slot)}
	for _, v := range view {
		if !v.has("master") || v.has("fail") {
			continue
		}
		m.masters = append(m.masters, v)
		if v.serves(slot) {
			m.src = v
		}
		if v.addr == to {
			m.dst = v
		}
	}
	switch {
	case m.src.id == "":
		return nil, fmt.Errorf("redistest: no master serves slot %d", slot)
	case m.dst.id == "":
		return nil, fmt.Errorf("redistest: %s is not a master of this cluster", to)
	case m.src.id == m.dst.id:
		return nil, fmt.Errorf("redistest: slot %d is on %s already", slot, to)
	}
	m.start = time.Now()
	if _, err := Do(ctx, m.dst.addr, nil, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.src.id); err != nil {
		return nil, fmt.Errorf("SETSLOT IMPORTING on %s: %w", m.dst.addr, err)
	}
	if _, err := Do(ctx, m.src.addr, nil, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.dst.id); err != nil {
		return nil, fmt.Errorf("SETSLOT MIGRATING on %s: %w", m.src.addr, err)
	}
	return m, nil
}

// Source is the address of the master the slot moves from.
func (m *Migration) Source() string { return m.src.addr }

// Move migrates keys (of the slot) from the source to the target.
func (m *Migration) Move(ctx context.Context, keys ...string) error {
	conn, err := Dial(ctx, m.src.addr, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	return m.move(ctx, conn, keys)
}

func (m *Migration) move(ctx context.Context, conn *Conn, keys []string) error {
	host, port, err := net.SplitHostPort(m.dst.addr)
	if err != nil {
		return err
	}
	args := append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)
	if _, err := conn.Do(ctx, args...); err != nil {
		return fmt.Errorf("MIGRATE of %d keys to %s: %w", len(keys), m.dst.addr, err)
	}
	return nil
}

// MoveAll migrates the slot's keys, batch at a time, with a pause after
// each batch, until the source has none left.
func (m *Migration) MoveAll(ctx context.Context, batch int, pause time.Duration) error {
	conn, err := Dial(ctx, m.src.addr, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		v, err := conn.Do(ctx, "CLUSTER", "GETKEYSINSLOT", m.slot, strconv.Itoa(batch))
		if err != nil {
			return fmt.Errorf("GETKEYSINSLOT on %s: %w", m.src.addr, err)
		}
		reply, _ := v.([]any)
		if len(reply) == 0 {
			return nil
		}
		keys := make([]string, len(reply))
		for i, k := range reply {
			keys[i], _ = k.(string)
		}
		if err := m.move(ctx, conn, keys); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// Finish gives the slot to the target: SETSLOT NODE on the target first
// (once it owns the slot, the source's MOVED sends clients there, and no
// node sends them back), then the source and the other masters. It returns
// the time since StartMigration.
func (m *Migration) Finish(ctx context.Context) (time.Duration, error) {
	order := []clusterNode{m.dst, m.src}
	for _, n := range m.masters {
		if n.id != m.dst.id && n.id != m.src.id {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if _, err := Do(ctx, n.addr, nil, "CLUSTER", "SETSLOT", m.slot, "NODE", m.dst.id); err != nil {
			return 0, fmt.Errorf("SETSLOT NODE on %s: %w", n.addr, err)
		}
	}
	return time.Since(m.start), nil
}

// SlotOf is the Cluster hash slot of key: CRC16 (XMODEM) of its hash tag,
// the part between its first "{" and the next "}" when not empty, or of the
// whole key, modulo 16384.
func SlotOf(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// MasterOfSlot is the master that serves slot now, as a running node sees
// it.
func (c *Cluster) MasterOfSlot(slot int) (string, error) {
	view, err := c.liveView()
	if err != nil {
		return "", err
	}
	for _, v := range view {
		if v.has("master") && !v.has("fail") && v.serves(slot) {
			return v.addr, nil
		}
	}
	return "", fmt.Errorf("redistest: no master serves slot %d", slot)
}

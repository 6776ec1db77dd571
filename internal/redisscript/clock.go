package redisscript

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// clock is what a Conn knows of its server's clock, so that an acquire can
// carry its deadline on that clock, which the server checks (take.lua's
// acquire): an acquire that a stalled connection delivers after its caller
// gave up takes nothing, however late. Every fencing token is a reading of
// the server's clock (in microseconds), and so is the reply to an acquire
// that came too late: each one sets the offset. It is read on the
// monotonic clock, so that a step of the local wall clock changes nothing.
type clock struct {
	base   time.Time    // the origin of the local readings, monotonic
	offset atomic.Int64 // server µs minus local µs since base; 0: unknown
}

// lateMargin is how far past the caller's deadline an acquire may still
// run: what covers the error of the offset (a reading is late by the
// reply's trip, a few ms at most) and a server clock that runs a little
// fast. An attempt that runs between the deadline and this margin is
// still covered by the give-back's mark, which lives at least a lease
// (GiveBackFor when that is longer), from the give-back on.
const lateMargin = 500 * time.Millisecond

// observe records that the server's clock read serverMicros now.
func (k *clock) observe(serverMicros int64) {
	if serverMicros <= 0 {
		return
	}
	if off := serverMicros - time.Since(k.base).Microseconds(); off != 0 {
		k.offset.Store(off)
	}
}

// deadline is the server's clock, as a decimal string of microseconds, at
// the end of ctx plus lateMargin; "0" (no deadline) when ctx has none or the
// server's clock is still unknown.
func (k *clock) deadline(ctx context.Context) string {
	d, ok := ctx.Deadline()
	off := k.offset.Load()
	if !ok || off == 0 {
		return "0"
	}
	return strconv.FormatInt(off+d.Add(lateMargin).Sub(k.base).Microseconds(), 10)
}

// Deadline is the deadline an acquire sends (take.lua's acquire): the end
// of ctx on the server's clock, with a margin. The first call of a Conn
// reads the server's clock (TIME) when no fencing token has yet; when that
// fails too, the acquire goes without one, as before: the give-back's mark
// still covers a lease after its give-back.
func (c *Conn) Deadline(ctx context.Context) string {
	if c.clock.offset.Load() == 0 {
		cmd := redis.NewTimeCmd(ctx, "time")
		if err := c.Process(ctx, cmd); err == nil {
			c.clock.observe(cmd.Val().UnixMicro())
		}
	}
	return c.clock.deadline(ctx)
}

// ObserveFence records a fencing token just received from the server as a
// reading of its clock.
func (c *Conn) ObserveFence(fence int64) { c.clock.observe(fence) }

// ErrLate is the error of an acquire that reached the server after the
// deadline it carried: it took nothing. It matches ErrUnavailable: the
// server did not answer in time.
var ErrLate = fmt.Errorf("%w: the acquire reached Redis after its deadline and took nothing", ErrUnavailable)

// Late turns the reply of an acquire that ran after its deadline ("LATE
// <server µs>") into ErrLate, and records the server's clock it carries:
// should the local reading be off (the server's clock stepped), the next
// acquire sends a right deadline. Any other error is returned as it is.
func (c *Conn) Late(err error) error {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return err
	}
	rest, ok := strings.CutPrefix(rerr.Error(), "LATE ")
	if !ok {
		return err
	}
	if micros, perr := strconv.ParseInt(rest, 10, 64); perr == nil {
		c.clock.observe(micros)
	}
	return ErrLate
}

// Grant is the package's Grant for an acquire run on c: the reply of one
// that ran too late is ErrLate, and a fencing token granted is a reading
// of the server's clock.
func (c *Conn) Grant(ctx context.Context, cmd *redis.Cmd, err error, notObtained func(time.Duration) error) (int64, error) {
	if err = c.Late(err); errors.Is(err, ErrLate) {
		return 0, err
	}
	fence, err := Grant(ctx, cmd, err, notObtained)
	if err == nil {
		c.ObserveFence(fence)
	}
	return fence, err
}

package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds one Do call when the context has no earlier deadline,
// so a paused server cannot hang a test's setup.
const DefaultTimeout = 5 * time.Second

// Error is a RESP error reply ("-MOVED 866 127.0.0.1:7001", "-NOPERM ...").
// It is the server's answer, not a transport failure: check for it with
// errors.As.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// Prefix returns the error's first word (MOVED, ASK, NOPERM, WRONGPASS...).
func (e *Error) Prefix() string {
	p, _, _ := strings.Cut(e.Msg, " ")
	return p
}

// Conn is a minimal RESP2 connection for test setup and assertions; the
// package stays free of a Redis client library on purpose, so that the
// topologies do not depend on the client under test.
type Conn struct {
	c net.Conn
	r *bufio.Reader
}

// Dial connects to addr, over TLS when tlsConf is not nil. The connection is
// bound to ctx only while dialling.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config) (*Conn, error) {
	d := &net.Dialer{Timeout: DefaultTimeout}
	var c net.Conn
	var err error
	if tlsConf != nil {
		c, err = (&tls.Dialer{NetDialer: d, Config: tlsConf}).DialContext(ctx, "tcp", addr)
	} else {
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, r: bufio.NewReader(c)}, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Do sends one command and reads its reply. A reply is a string (simple or
// bulk string), an int64 (integer), a []any (array, elements alike) or nil
// (null bulk string or array); an error reply comes back as *Error.
func (c *Conn) Do(ctx context.Context, args ...string) (any, error) {
	deadline := time.Now().Add(DefaultTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.c.SetDeadline(deadline)
	// A deadline in the past is the way to interrupt a blocked read when ctx
	// is cancelled early; wait for it to be set so that it cannot hit the
	// connection's next command.
	cancelled := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		_ = c.c.SetDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stop() {
			<-cancelled
		}
	}()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.c, b.String()); err != nil {
		return nil, err
	}
	v, err := readReply(c.r)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(*Error); ok {
		return nil, e
	}
	return v, nil
}

// Do runs one command on a fresh connection to addr (TLS when tlsConf is not
// nil).
func Do(ctx context.Context, addr string, tlsConf *tls.Config, args ...string) (any, error) {
	c, err := Dial(ctx, addr, tlsConf)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Do(ctx, args...)
}

// DoString is Do for commands whose reply is a string or an integer (INFO,
// CLUSTER NODES, CONFIG SET, ACL SETUSER, CLUSTER KEYSLOT...).
func DoString(ctx context.Context, addr string, tlsConf *tls.Config, args ...string) (string, error) {
	v, err := Do(ctx, addr, tlsConf, args...)
	if err != nil {
		return "", err
	}
	return replyString(v)
}

func replyString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case nil:
		return "", errors.New("redistest: null reply")
	default:
		return "", fmt.Errorf("redistest: reply %T is not a string", v)
	}
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return nil, fmt.Errorf("redistest: malformed RESP line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return &Error{Msg: body}, nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redistest: unsupported RESP type %q", kind)
}

// InfoField returns the value of key in an INFO reply ("role" gives
// "master"), or "" when absent.
func InfoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if ok && k == key {
			return v
		}
	}
	return ""
}

package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
)

// Outcome is what a completed record says about its request.
type Outcome byte

const (
	// Replayable: the backend's answer, kept whole (status, headers,
	// body): a retry gets it again.
	Replayable Outcome = 'R'
	// NotReplayable: the backend answered, but the body was not kept (too
	// large, streamed, or the answer to HEAD): status and headers only. A
	// retry must not run the request again, and cannot get its answer.
	NotReplayable Outcome = 'N'
	// Unknown: the backend was reached but its answer never came (timeout,
	// reset, lost lock): the request may or may not have taken effect.
	// Body holds the answer that says so.
	Unknown Outcome = 'U'
	// Abandoned is not a completed record's: it is what Remove reports of
	// a record in progress whose holder's lease ran out before it stored
	// an outcome (ErrAbandoned): the request may or may not have run.
	Abandoned Outcome = 'A'
)

// Response is a completed request as stored.
type Response struct {
	Outcome Outcome
	Status  int
	Header  http.Header
	Body    []byte
}

// formatVersion starts the encoded response, so the layout can change.
const formatVersion = 1

// fingerprintLen is the length of a fingerprint: hex SHA-256.
const fingerprintLen = 64

// encode lays out a completed record: 'C', the fingerprint, then the
// response (version, outcome, status, headers as counted length-prefixed
// strings, and the body as the rest), ready for one SET.
func encode(fingerprint string, r *Response) []byte {
	n := 1 + len(fingerprint) + 4 + binary.MaxVarintLen64 + len(r.Body)
	for name, vals := range r.Header {
		n += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range vals {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, 'C')
	b = append(b, fingerprint...)
	b = append(b, formatVersion, byte(r.Outcome))
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	// In sorted order: the same response always encodes to the same bytes,
	// which is how a retried completion recognises its own record.
	for _, name := range slices.Sorted(maps.Keys(r.Header)) {
		vals := r.Header[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errCorrupt = errors.New("record: stored response is corrupt")

// headLen is the length of a completed record's head: 'C', the
// fingerprint, the version, the outcome and the status.
const headLen = 1 + fingerprintLen + 4

// inProgressLen is the length of a record in progress: 'P', the
// fingerprint, and its holder's token (a UUID); the first begin to find
// its lock gone appends '@' and the time it is abandoned at (begin.lua).
const inProgressLen = 1 + fingerprintLen + 36

// inProgress reports whether b is a record in progress, and its holder's
// token.
func inProgress(b []byte) (holder string, ok bool) {
	if len(b) < inProgressLen || b[0] != 'P' {
		return "", false
	}
	return string(b[1+fingerprintLen : inProgressLen]), true
}

// decodeHead reads the outcome and status of a completed record from its
// head (at least headLen bytes of it). A record in progress is
// Abandoned: what Remove, which never removes one whose lock is held,
// deletes.
func decodeHead(b []byte) (Outcome, int, error) {
	if len(b) > 0 && b[0] == 'P' {
		return Abandoned, 0, nil
	}
	if len(b) < headLen || b[0] != 'C' {
		return 0, 0, errCorrupt
	}
	b = b[1+fingerprintLen:]
	if b[0] != formatVersion {
		return 0, 0, fmt.Errorf("%w: format version %d", errCorrupt, b[0])
	}
	o := Outcome(b[1])
	switch o {
	case Replayable, NotReplayable, Unknown:
	default:
		return 0, 0, fmt.Errorf("%w: outcome %q", errCorrupt, b[1])
	}
	return o, int(binary.BigEndian.Uint16(b[2:4])), nil
}

// decode reads a completed record.
func decode(b []byte) (fingerprint string, r *Response, err error) {
	outcome, status, err := decodeHead(b)
	if err != nil {
		return "", nil, err
	}
	fingerprint = string(b[1 : 1+fingerprintLen])
	r = &Response{Outcome: outcome, Status: status}
	b = b[headLen:]
	d := decoder{b: b}
	nh := d.uvarint()
	if nh > uint64(len(b)) {
		return "", nil, errCorrupt
	}
	r.Header = make(http.Header, nh)
	for range nh {
		name := d.string()
		nv := d.uvarint()
		if nv > uint64(len(b)) {
			return "", nil, errCorrupt
		}
		vals := make([]string, 0, nv)
		for range nv {
			vals = append(vals, d.string())
		}
		if d.err != nil {
			return "", nil, d.err
		}
		r.Header[name] = vals
	}
	if d.err != nil {
		return "", nil, d.err
	}
	r.Body = d.b
	return fingerprint, r, nil
}

// decoder reads length-prefixed strings; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Size is about what r takes in Redis: its body and headers.
func (r *Response) Size() int {
	n := len(r.Body)
	for name, vals := range r.Header {
		n += len(name)
		for _, v := range vals {
			n += len(v)
		}
	}
	return n
}

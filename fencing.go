package redislock

import (
	"io"
	"net/http"
)

// stripFencing removes a client-sent fencing header from r, in the header
// and as a trailer: only the handler may tell the backend a fencing token.
// Trailers arrive with the end of the body, after the handler has passed
// the request on, so the body is wrapped to remove the field then.
func stripFencing(r *http.Request, name string) {
	r.Header.Del(name)
	if r.Trailer == nil && !chunked(r) {
		return // HTTP/1 sends trailers only with a chunked body
	}
	r.Trailer.Del(name)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &trailerStripper{ReadCloser: r.Body, r: r, name: name}
	}
}

func chunked(r *http.Request) bool {
	return len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked"
}

// trailerStripper deletes a trailer field as soon as the body ends, which is
// when the server has filled in the trailers.
type trailerStripper struct {
	io.ReadCloser
	r    *http.Request
	name string
}

func (t *trailerStripper) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err != nil {
		t.r.Trailer.Del(t.name)
	}
	return n, err
}

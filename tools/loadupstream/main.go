// Command loadupstream is the upstream of scripts/loadtest.sh: it answers
// every request with a small JSON 200 at once, so the load test measures
// Caddy and the lock rather than a backend. It prints its address on the
// first line of stdout (listen on port 0 to let the kernel pick one).
//
// -size N makes the answer a JSON object of N bytes, as an API's small
// answer (the idempotency mode stores and replays it); without it the
// answer is {"ok":true}.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	size := flag.Int("size", 0, "answer a JSON object of this many bytes (0: {\"ok\":true})")
	flag.Parse()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr())
	os.Stdout.Sync()

	body := []byte("{\"ok\":true}\n")
	if *size > 0 {
		body = jsonBody(*size)
	}
	length := strconv.Itoa(len(body))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Drain the body so keep-alive connections are reused.
			_, _ = io.Copy(io.Discard, r.Body)
			h := w.Header()
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{length}
			_, _ = w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Fatal(srv.Serve(ln))
}

// chargeJSON is the shape of the -size answer: a payment API's charge, padded
// to the size asked for (or left as it is when that is smaller).
const chargeJSON = `{"id":"ch_3PqLt2eZvKYlo2C1","object":"charge","amount":1299,"currency":"eur","status":"succeeded","pad":""}`

// jsonBody is chargeJSON and a newline, padded to size bytes.
func jsonBody(size int) []byte {
	pad := max(size-len(chargeJSON)-1, 0)
	b := make([]byte, 0, len(chargeJSON)+1+pad)
	b = append(b, chargeJSON[:len(chargeJSON)-2]...)
	for range pad {
		b = append(b, 'x')
	}
	b = append(b, chargeJSON[len(chargeJSON)-2:]...)
	return append(b, '\n')
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ledger is the demo's payment backend: a slow legacy gateway behind Caddy.
//
// It has no idempotency of its own: every charge request that reaches it is
// a charge, whether a duplicate fired at the same moment or a retry sent a
// minute later. Many legacy backends are like this; where one checks
// "already paid?" first, the check and the charge's write are often a
// gateway call (Delay) apart, a window that concurrent duplicates all pass.
// The ledger has no such check on purpose: one that turned a late retry
// away would hide what the demo measures, what the proxy lets through. Behind
// redis_lock, duplicates that overlap get 409 but a retry after the first
// charge has finished is charged again; behind redis_lock with idempotency
// the retry is answered from the stored response and never gets here. The
// ledger also shows the backend's half of the lock's deal, fencing tokens.
type Ledger struct {
	// Delay is how long one charge takes at the gateway.
	Delay time.Duration

	mu     sync.Mutex
	orders map[string]*orderState
}

// orderState is one order's line in the ledger.
type orderState struct {
	charges     int   // successful charges: more than one is a double charge
	fence       int64 // highest fencing token accepted; 0: none seen yet
	staleFences int   // charges rejected for a lower fencing token
}

// ErrStaleFence is returned for a charge whose fencing token is lower than
// one already accepted for the order: its lock holder has been superseded.
var ErrStaleFence = errors.New("stale fencing token")

// NewLedger returns an empty ledger whose charges take delay each.
func NewLedger(delay time.Duration) *Ledger {
	return &Ledger{Delay: delay, orders: make(map[string]*orderState)}
}

// ChargeResult is what one charge attempt did.
type ChargeResult struct {
	OrderID      string `json:"order_id"`
	Status       string `json:"status"` // charged
	Charge       int    `json:"charge,omitempty"`
	DoubleCharge bool   `json:"double_charge,omitempty"`
	FencingToken string `json:"fencing_token,omitempty"` // as the backend saw it
}

// Charge charges order once more, however often it has been charged before
// (see Ledger). fence is the request's fencing token, 0 when it carried
// none (the plain route sends none: such charges are accepted, as a legacy
// backend would). A token lower than the highest one accepted for the order
// is rejected with ErrStaleFence; an equal one is the same holder retrying
// and is accepted.
//
// A real backend does the fence check in the same transaction as its write,
// for example in SQL with one write per token:
//
//	UPDATE orders SET fence = $1 WHERE id = $2 AND fence < $1
//	-- 0 rows updated: a newer holder has been here; roll back, answer 409/412
//
// (`fence <= $1` when, as here, one holder may write more than once).
func (l *Ledger) Charge(order string, fence int64) (ChargeResult, error) {
	res := ChargeResult{OrderID: order}
	if fence > 0 {
		res.FencingToken = strconv.FormatInt(fence, 10)
	}
	l.mu.Lock()
	o := l.order(order)
	if fence > 0 {
		if fence < o.fence {
			o.staleFences++
			l.mu.Unlock()
			return res, fmt.Errorf("%w: %d is lower than %d, already accepted for order %q",
				ErrStaleFence, fence, o.fence, order)
		}
		o.fence = fence
	}
	l.mu.Unlock()

	// The slow gateway call. It is not cancelled with the request: a
	// gateway that has taken the money does not give it back because the
	// client left.
	t := time.NewTimer(l.Delay)
	defer t.Stop()
	<-t.C

	l.mu.Lock()
	defer l.mu.Unlock()
	o.charges++
	res.Status = "charged"
	res.Charge = o.charges
	res.DoubleCharge = o.charges > 1
	return res, nil
}

func (l *Ledger) order(id string) *orderState {
	o := l.orders[id]
	if o == nil {
		o = &orderState{}
		l.orders[id] = o
	}
	return o
}

// LedgerStats sums the ledger over a set of orders.
type LedgerStats struct {
	Orders        int // orders charged at least once
	Charges       int
	DoubleCharges int // charges beyond the first of each order
	StaleFences   int
}

// Stats sums the ledger over orders.
func (l *Ledger) Stats(orders []string) LedgerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s LedgerStats
	for _, id := range orders {
		o := l.orders[id]
		if o == nil {
			continue
		}
		if o.charges > 0 {
			s.Orders++
		}
		s.Charges += o.charges
		s.DoubleCharges += max(0, o.charges-1)
		s.StaleFences += o.staleFences
	}
	return s
}

// chargeRequest is the JSON body of POST /charge.
type chargeRequest struct {
	OrderID     string `json:"order_id"`
	AmountCents int    `json:"amount_cents"`
}

// ServeHTTP is POST /charge: Idempotency-Key names the order (the JSON
// body's order_id is used when the header is absent), Fencing-Token is the
// lock's token when the request came through redis_lock.
func (l *Ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/charge" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use POST"})
		return
	}
	var body chargeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body must be JSON: " + err.Error()})
		return
	}
	order := r.Header.Get("Idempotency-Key")
	if order == "" {
		order = body.OrderID
	}
	if order == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "Idempotency-Key header (the order id) is required"})
		return
	}
	var fence int64
	if raw := strings.TrimSpace(r.Header.Get("Fencing-Token")); raw != "" {
		f, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || f <= 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "Fencing-Token must be a positive integer"})
			return
		}
		fence = f
	}
	res, err := l.Charge(order, fence)
	if errors.Is(err, ErrStaleFence) {
		// 412, not 409: in this demo 409 means redis_lock turned a duplicate away.
		writeJSON(w, http.StatusPreconditionFailed, map[string]string{"error": err.Error()})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// backendServer is the ledger listening on a loopback port.
type backendServer struct {
	Addr string
	srv  *http.Server
	done chan struct{}
}

// startBackend serves l on a free loopback port.
func startBackend(l *Ledger) (*backendServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	b := &backendServer{Addr: ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: l, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(ln)
	}()
	return b, nil
}

// Close stops the backend, letting charges in flight finish.
func (b *backendServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.srv.Shutdown(ctx)
	<-b.done
}

//go:build linux

package chaos

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// receiver is the downstream: it de-duplicates by Idempotency-Key, records each request's
// X-Outbox-Attempt, counts requests per message and effects (the first successful request
// per key), and can be told to misbehave.
type receiver struct {
	srv     *httptest.Server
	url     string
	closing chan struct{}

	delay atomic.Int64 // nanoseconds each POST takes before it is processed
	flap  atomic.Bool  // while set, POSTs fail in turn: 503, a reset, a reply too late
	flaps atomic.Int64

	mu       sync.Mutex
	requests map[string]int   // POSTs per message ID
	attempts map[string][]int // X-Outbox-Attempt of each POST
	effects  map[string]time.Time
	// redelivered counts POSTs per message that arrived after it was processed.
	redelivered map[string]int
	total       int
	checks      int
	bad         []string       // requests that broke the contract (no key, bad attempt header)
	binary      map[string]int // POSTs to the binary-body downstreams, by path
}

// binaryRequests returns the POSTs the binary-body downstreams received, by path.
func (r *receiver) binaryRequests() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.binary {
		out[k] = v
	}
	return out
}

func newReceiver() *receiver {
	r := &receiver{closing: make(chan struct{}), requests: map[string]int{}, attempts: map[string][]int{}, effects: map[string]time.Time{}, redelivered: map[string]int{}, binary: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", r.post)
	mux.HandleFunc("GET /events/{id}", r.get)
	// A downstream that always refuses, and one that never answers in time.
	mux.HandleFunc("POST /poison", func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "this message can never be processed", http.StatusUnprocessableEntity)
	})
	// Downstreams that refuse with a binary body, NUL bytes included.
	for _, code := range []int{http.StatusUnprocessableEntity, http.StatusInternalServerError} {
		path := "binary" + strconv.Itoa(code)
		mux.HandleFunc("POST /"+path, func(w http.ResponseWriter, req *http.Request) {
			r.mu.Lock()
			r.binary[path]++
			r.mu.Unlock()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(code)
			_, _ = w.Write([]byte("\x00\x01\x02\xff\xfe\x00 refused \x00"))
		})
	}
	mux.HandleFunc("POST /hang", func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-req.Context().Done():
		case <-r.closing:
		case <-time.After(time.Minute):
		}
	})
	r.srv = httptest.NewServer(mux)
	r.url = r.srv.URL
	return r
}

// close stops the receiver, releasing the requests it holds.
func (r *receiver) close() {
	close(r.closing)
	r.srv.Close()
}

func (r *receiver) setDelay(d time.Duration) { r.delay.Store(int64(d)) }

// setFlapping makes the receiver misbehave (or stop misbehaving).
func (r *receiver) setFlapping(on bool) { r.flap.Store(on) }

func (r *receiver) post(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	key := req.Header.Get("Idempotency-Key")
	attempt, aerr := strconv.Atoi(req.Header.Get("X-Outbox-Attempt"))
	r.mu.Lock()
	r.total++
	if key == "" || aerr != nil || attempt < 1 || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
		r.bad = append(r.bad, req.Header.Get("Idempotency-Key")+" attempt="+req.Header.Get("X-Outbox-Attempt"))
		r.mu.Unlock()
		http.Error(w, "missing Idempotency-Key or X-Outbox-Attempt", http.StatusBadRequest)
		return
	}
	r.requests[key]++
	r.attempts[key] = append(r.attempts[key], attempt)
	if _, done := r.effects[key]; done {
		r.redelivered[key]++
	}
	r.mu.Unlock()

	if r.flap.Load() {
		switch r.flaps.Add(1) % 4 {
		case 0:
			http.Error(w, "flapping", http.StatusServiceUnavailable)
			return
		case 1:
			// A connection reset before anything was processed.
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					if tcp, ok := conn.(*net.TCPConn); ok {
						_ = tcp.SetLinger(0)
					}
					conn.Close()
					return
				}
			}
		case 2:
			// Processed, but the answer comes after the sender's 2s timeout.
			time.Sleep(2500 * time.Millisecond)
		}
	}
	// The downstream does its work whether or not the caller is still there.
	if d := time.Duration(r.delay.Load()); d > 0 {
		time.Sleep(d)
	}
	r.mu.Lock()
	if _, ok := r.effects[key]; !ok {
		r.effects[key] = time.Now()
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// get answers check_url: 200 when the message was processed, else 404.
func (r *receiver) get(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	r.mu.Lock()
	r.checks++
	_, ok := r.effects[id]
	r.mu.Unlock()
	if ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	http.NotFound(w, req)
}

func (r *receiver) totalRequests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

type receiverSnapshot struct {
	requests    map[string]int
	attempts    map[string][]int
	effects     map[string]bool
	redelivered map[string]int
	total       int
	checks      int
	bad         []string
}

func (r *receiver) snapshot() receiverSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := receiverSnapshot{requests: map[string]int{}, attempts: map[string][]int{}, effects: map[string]bool{}, redelivered: map[string]int{},
		total: r.total, checks: r.checks, bad: append([]string(nil), r.bad...)}
	for k, v := range r.requests {
		s.requests[k] = v
	}
	for k, v := range r.attempts {
		s.attempts[k] = append([]int(nil), v...)
	}
	for k := range r.effects {
		s.effects[k] = true
	}
	for k, v := range r.redelivered {
		s.redelivered[k] = v
	}
	return s
}

package testutil

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Receiver is a downstream for the HTTP sink that keeps the contract the outbox asks of
// receivers: it processes each message at most once, keyed by its Idempotency-Key, and
// answers check_url. It serves POST /events and GET /events/{id} (200 once the message was
// processed, else 404), and records every request.
//
// A request without an Idempotency-Key, without a valid Outbox-Attempt, not JSON, or
// whose body names another message ID breaks the contract: it is answered 400 and recorded
// in Snapshot().Bad.
type Receiver struct {
	// URL is the server's base URL; the sink's url is URL + "/events".
	URL string
	srv *httptest.Server
	mux *http.ServeMux

	// Before, when set, runs for each well-formed POST after it is recorded and before it
	// is processed; it returns true when it has answered the request itself (the message is
	// then not processed). Set it before the first request.
	Before func(w http.ResponseWriter, req *http.Request) (answered bool)

	mu          sync.Mutex
	requests    map[string]int       // POSTs per message ID
	attempts    map[string][]int     // Outbox-Attempt of each POST
	effects     map[string]time.Time // when each message was processed
	arrivals    []string             // message IDs in the order they were processed
	redelivered map[string]int       // POSTs per message that arrived after it was processed
	status      map[string]int       // topic → status to answer instead of processing
	reject      map[string]int       // message ID → status to answer instead of processing
	total       int
	checks      int
	bad         []string
}

// NewReceiver starts a Receiver. Close stops it.
func NewReceiver() *Receiver {
	r := &Receiver{
		requests: map[string]int{}, attempts: map[string][]int{}, effects: map[string]time.Time{},
		redelivered: map[string]int{}, status: map[string]int{}, reject: map[string]int{},
	}
	r.mux = http.NewServeMux()
	r.mux.HandleFunc("POST /events", r.post)
	r.mux.HandleFunc("GET /events/{id}", r.get)
	r.srv = httptest.NewServer(r.mux)
	r.URL = r.srv.URL
	return r
}

// Handle adds a handler beside /events (for downstreams that misbehave in their own way).
func (r *Receiver) Handle(pattern string, h http.HandlerFunc) { r.mux.HandleFunc(pattern, h) }

// Close stops the server.
func (r *Receiver) Close() { r.srv.Close() }

// SetStatus makes the receiver answer every message of topic with code, without processing
// it.
func (r *Receiver) SetStatus(topic string, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status[topic] = code
}

// ClearStatus makes the receiver process topic's messages again.
func (r *Receiver) ClearStatus(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.status, topic)
}

// Reject makes the receiver answer one message with code, without processing it; code 0
// takes it back.
func (r *Receiver) Reject(messageID string, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if code == 0 {
		delete(r.reject, messageID)
		return
	}
	r.reject[messageID] = code
}

// Count returns how many POSTs the message got and how many times it was processed (0 or
// 1).
func (r *Receiver) Count(messageID string) (requests, effects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.effects[messageID]; ok {
		effects = 1
	}
	return r.requests[messageID], effects
}

// Totals returns the POSTs and the processed messages over all messages.
func (r *Receiver) Totals() (requests, effects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.requests {
		requests += n
	}
	return requests, len(r.effects)
}

// Arrivals returns the message IDs in the order they were processed.
func (r *Receiver) Arrivals() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.arrivals...)
}

// Snapshot is a copy of what a Receiver recorded.
type Snapshot struct {
	Requests    map[string]int
	Attempts    map[string][]int
	Effects     map[string]bool
	Redelivered map[string]int
	Total       int // POSTs, well-formed or not
	Checks      int // GET /events/{id}
	Bad         []string
}

// Snapshot returns a copy of what the receiver recorded.
func (r *Receiver) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Snapshot{Requests: map[string]int{}, Attempts: map[string][]int{}, Effects: map[string]bool{}, Redelivered: map[string]int{},
		Total: r.total, Checks: r.checks, Bad: append([]string(nil), r.bad...)}
	for k, v := range r.requests {
		s.Requests[k] = v
	}
	for k, v := range r.attempts {
		s.Attempts[k] = append([]int(nil), v...)
	}
	for k := range r.effects {
		s.Effects[k] = true
	}
	for k, v := range r.redelivered {
		s.Redelivered[k] = v
	}
	return s
}

func (r *Receiver) post(w http.ResponseWriter, req *http.Request) {
	var body struct {
		MessageID string `json:"message_id"`
		Topic     string `json:"topic"`
	}
	key := req.Header.Get("Idempotency-Key")
	attempt, aerr := strconv.Atoi(req.Header.Get("Outbox-Attempt"))
	derr := json.NewDecoder(req.Body).Decode(&body)
	r.mu.Lock()
	r.total++
	if key == "" || aerr != nil || attempt < 1 || derr != nil || body.MessageID != key ||
		!strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
		r.bad = append(r.bad, key+" attempt="+req.Header.Get("Outbox-Attempt"))
		r.mu.Unlock()
		http.Error(w, "missing Idempotency-Key or Outbox-Attempt, or a body of another message", http.StatusBadRequest)
		return
	}
	r.requests[key]++
	r.attempts[key] = append(r.attempts[key], attempt)
	if _, done := r.effects[key]; done {
		r.redelivered[key]++
	}
	code, refused := r.reject[key]
	if !refused {
		code, refused = r.status[body.Topic]
	}
	r.mu.Unlock()
	if refused {
		w.WriteHeader(code)
		return
	}
	if r.Before != nil && r.Before(w, req) {
		return
	}
	r.mu.Lock()
	if _, ok := r.effects[key]; !ok {
		r.effects[key] = time.Now()
		r.arrivals = append(r.arrivals, key)
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (r *Receiver) get(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.checks++
	_, ok := r.effects[req.PathValue("id")]
	r.mu.Unlock()
	if ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	http.NotFound(w, req)
}

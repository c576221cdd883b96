//go:build linux

package chaos

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-go/outbox/internal/testutil"
)

// receiver is the downstream: the idempotent receiver of the tests (requests, attempts
// and effects per message, check_url), which can be told to misbehave, beside a downstream
// that always refuses (/poison), ones that refuse with a binary body (/binary422,
// /binary500) and one that never answers in time (/hang).
type receiver struct {
	*testutil.Receiver
	url     string
	closing chan struct{}

	delay    atomic.Int64 // nanoseconds each POST takes before it is processed
	inFlight atomic.Int64 // POSTs in their delay
	flap     atomic.Bool  // while set, POSTs fail in turn: 503, a reset, a reply too late
	flaps    atomic.Int64

	mu     sync.Mutex
	binary map[string]int // POSTs to the binary-body downstreams, by path
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
	r := &receiver{Receiver: testutil.NewReceiver(), closing: make(chan struct{}), binary: map[string]int{}}
	r.url = r.URL
	r.Before = r.misbehave
	r.Handle("POST /poison", func(w http.ResponseWriter, req *http.Request) {
		http.Error(w, "this message can never be processed", http.StatusUnprocessableEntity)
	})
	// Downstreams that refuse with a binary body, NUL bytes included.
	for _, code := range []int{http.StatusUnprocessableEntity, http.StatusInternalServerError} {
		path := "binary" + strconv.Itoa(code)
		r.Handle("POST /"+path, func(w http.ResponseWriter, req *http.Request) {
			r.mu.Lock()
			r.binary[path]++
			r.mu.Unlock()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(code)
			_, _ = w.Write([]byte("\x00\x01\x02\xff\xfe\x00 refused \x00"))
		})
	}
	r.Handle("POST /hang", func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-req.Context().Done():
		case <-r.closing:
		case <-time.After(time.Minute):
		}
	})
	return r
}

// close stops the receiver, releasing the requests it holds.
func (r *receiver) close() {
	close(r.closing)
	r.Close()
}

func (r *receiver) setDelay(d time.Duration) { r.delay.Store(int64(d)) }

// setFlapping makes the receiver misbehave (or stop misbehaving).
func (r *receiver) setFlapping(on bool) { r.flap.Store(on) }

// misbehave runs before a well-formed POST is processed: while flapping, requests fail in
// turn (503, a connection reset, an answer after the sender's 2s timeout); the delay holds
// each one before the work.
func (r *receiver) misbehave(w http.ResponseWriter, _ *http.Request) (answered bool) {
	if r.flap.Load() {
		switch r.flaps.Add(1) % 4 {
		case 0:
			http.Error(w, "flapping", http.StatusServiceUnavailable)
			return true
		case 1:
			// A connection reset before anything was processed.
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					if tcp, ok := conn.(*net.TCPConn); ok {
						_ = tcp.SetLinger(0)
					}
					conn.Close()
					return true
				}
			}
		case 2:
			// Processed, but the answer comes after the sender's 2s timeout.
			time.Sleep(2500 * time.Millisecond)
		}
	}
	// The downstream does its work whether or not the caller is still there.
	if d := time.Duration(r.delay.Load()); d > 0 {
		r.inFlight.Add(1)
		time.Sleep(d)
		r.inFlight.Add(-1)
	}
	return false
}

// sendsInFlight returns the number of POSTs the receiver is working on (in their delay).
func (r *receiver) sendsInFlight() int { return int(r.inFlight.Load()) }

func (r *receiver) totalRequests() int { return r.Snapshot().Total }

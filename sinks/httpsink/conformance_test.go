package httpsink_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/httpsink"
	"github.com/outbox-go/outbox/sinks/sinktest"
)

// receiver is a webhook receiver on the loopback, the http sink's real server: it keeps
// the POSTs it took and answers the check's GETs from them.
type receiver struct {
	srv *httptest.Server
	// answer is the status of every request when the receiver takes none; 0 takes the
	// POSTs (204).
	answer int
	stall  bool // take the POST, then never answer it

	mu      sync.Mutex
	got     []sinktest.Received
	ids     []string
	arrived chan struct{} // closed by the first stalled POST
	once    sync.Once
	cut     chan struct{} // closed to break the stalled POSTs' connections
	release chan struct{} // closed when the test ends
}

func newReceiver(t *testing.T, answer int, stall bool) *receiver {
	r := &receiver{answer: answer, stall: stall, arrived: make(chan struct{}), cut: make(chan struct{}), release: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		close(r.release)
		r.srv.Close()
	})
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if r.answer != 0 {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(r.answer)
		_, _ = io.WriteString(w, http.StatusText(r.answer))
		return
	}
	if req.Method == http.MethodGet { // the check: /events/{message_id}
		id := strings.TrimPrefix(req.URL.Path, "/events/")
		r.mu.Lock()
		found := false
		for _, got := range r.ids {
			found = found || got == id
		}
		r.mu.Unlock()
		if found {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var envelope struct {
		MessageID string          `json:"message_id"`
		Payload   json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(body, &envelope); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	headers := map[string]string{}
	for k := range req.Header {
		headers[k] = req.Header.Get(k)
	}
	// The key the receiver de-duplicates by is Idempotency-Key; the envelope and
	// Outbox-Message-Id must agree with it.
	key := req.Header.Get("Idempotency-Key")
	if other := req.Header.Get(sinks.HeaderMessageID); other != key || envelope.MessageID != key {
		key = fmt.Sprintf("Idempotency-Key %q, %s %q, body message_id %q", key, sinks.HeaderMessageID, other, envelope.MessageID)
	}
	r.mu.Lock()
	r.got = append(r.got, sinktest.Received{Payload: envelope.Payload, IdempotencyKey: key, Attempt: req.Header.Get(sinks.HeaderAttempt), Headers: headers})
	r.ids = append(r.ids, envelope.MessageID)
	r.mu.Unlock()
	if !r.stall {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	r.once.Do(func() { close(r.arrived) })
	select {
	case <-req.Context().Done():
	case <-r.release:
	case <-r.cut:
		// Break the connection with the request taken and no answer sent.
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
	}
}

func (r *receiver) received(_ *testing.T, id string) []sinktest.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sinktest.Received
	for i, got := range r.ids {
		if got == id {
			out = append(out, r.got[i])
		}
	}
	return out
}

// target is an http sink posting to r, with r's check.
func (r *receiver) target(t *testing.T) sinktest.Target {
	s, err := httpsink.New(httpsink.Config{URL: r.srv.URL + "/events", CheckURL: r.srv.URL + "/events/{message_id}"})
	if err != nil {
		t.Fatal(err)
	}
	return sinktest.Target{Handler: s, Received: r.received}
}

// withSecret is an http sink carrying secret in its URL's user information, path and
// query, in its check URL, and in an Authorization header, posting to base.
func withSecret(t *testing.T, base, secret string) delivery.Handler {
	host := strings.TrimPrefix(base, "http://")
	s, err := httpsink.New(httpsink.Config{
		URL:      "http://outbox:" + secret + "@" + host + "/hooks/" + secret + "?token=" + secret,
		CheckURL: "http://outbox:" + secret + "@" + host + "/hooks/" + secret + "/{message_id}?token=" + secret,
		Headers:  map[string]string{"Authorization": "Bearer " + secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConformance runs the sink conformance suite against webhook receivers on the
// loopback.
func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Name:           "http",
		CarriesAttempt: true,
		New:            func(t *testing.T) sinktest.Target { return newReceiver(t, 0, false).target(t) },
		// 503 (and 429, 408): the receiver turned the request away before processing it.
		Refuse: func(t *testing.T) sinktest.Target {
			return newReceiver(t, http.StatusServiceUnavailable, false).target(t)
		},
		// Any other 4xx: the receiver refuses the message for good.
		Reject: func(t *testing.T) sinktest.Target {
			return newReceiver(t, http.StatusUnprocessableEntity, false).target(t)
		},
		Stall: func(t *testing.T) sinktest.Stalled {
			r := newReceiver(t, 0, true)
			var once sync.Once
			return sinktest.Stalled{Target: r.target(t), Cut: func() {
				select {
				case <-r.arrived:
				case <-time.After(10 * time.Second):
					t.Errorf("no POST reached the receiver within 10s")
				}
				once.Do(func() { close(r.cut) })
			}}
		},
		WithSecret: func(t *testing.T, secret string) []delivery.Handler {
			refusing := newReceiver(t, http.StatusUnauthorized, false)
			failing := newReceiver(t, http.StatusInternalServerError, false)
			stalled := newReceiver(t, 0, true)
			// Port 1 (tcpmux): nothing listens there. A port freed by closing a listener
			// may be handed to another test's server before the send.
			nobody := "http://127.0.0.1:1"
			return []delivery.Handler{
				withSecret(t, refusing.srv.URL, secret),
				withSecret(t, failing.srv.URL, secret),
				withSecret(t, stalled.srv.URL, secret),
				withSecret(t, nobody, secret),
			}
		},
		BadConfig: func(secret string) []error {
			var errs []error
			for _, cfg := range []httpsink.Config{
				{URL: "ftp://outbox:" + secret + "@receiver/hooks/" + secret},
				{URL: "http://outbox:" + secret + "%zz@receiver/hooks/" + secret},
				{URL: "http://outbox:" + secret + "@receiver/hooks", TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}},
				{URL: "https://receiver/hooks", CheckURL: "http://outbox:" + secret + "@receiver/hooks/" + secret + "/{message_id}"},
				{URL: "https://receiver/hooks", CheckURL: "https://outbox:" + secret + "@other/hooks/{message_id}", TLS: sinks.TLSFiles{ServerName: "receiver"}},
				{URL: "https://receiver/hooks", CheckURL: "https://outbox:" + secret + "@receiver/hooks/" + secret + "/health"},
			} {
				_, err := httpsink.New(cfg)
				errs = append(errs, err)
			}
			return errs
		},
	})
}

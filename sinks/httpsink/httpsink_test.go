package httpsink

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/webhook"
)

func testDelivery() delivery.Message {
	return delivery.Message{
		MessageID: "0195c2a0-0000-7000-8000-0000000000aa", Topic: "order.created",
		Payload: json.RawMessage(`{"order_id":7}`), CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC),
		Attempt: 2, MaxAttempts: 4,
	}
}

func sinkFor(t *testing.T, h http.HandlerFunc) *Sink {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := New(Config{URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}", Headers: map[string]string{"Authorization": "Bearer t"}})
	require.NoError(t, err)
	return s
}

func kindOf(t *testing.T, err error) *delivery.Error {
	t.Helper()
	var herr *delivery.Error
	require.ErrorAs(t, err, &herr)
	return herr
}

func TestHTTPSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PostsTheMessage", func(t *testing.T) {
		t.Parallel()
		var got *http.Request
		var body map[string]any
		s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
			got = r
			b, _ := io.ReadAll(r.Body)
			require.NoError(t, json.Unmarshal(b, &body))
			w.WriteHeader(http.StatusAccepted)
		})
		require.NoError(t, s.Send(ctx, testDelivery()))
		require.Equal(t, http.MethodPost, got.Method)
		require.Equal(t, "/events", got.URL.Path)
		require.Equal(t, "application/json", got.Header.Get("Content-Type"))
		require.Equal(t, "0195c2a0-0000-7000-8000-0000000000aa", got.Header.Get("Idempotency-Key"))
		require.Equal(t, "2", got.Header.Get("Outbox-Attempt"))
		require.Equal(t, "0195c2a0-0000-7000-8000-0000000000aa", got.Header.Get("Outbox-Message-Id"))
		require.Equal(t, "order.created", got.Header.Get("Outbox-Topic"))
		require.Equal(t, "2026-11-30T09:00:00Z", got.Header.Get("Outbox-Created-At"))
		// The names before Outbox-*, sent for one more release.
		require.Equal(t, "2", got.Header.Get("X-Outbox-Attempt"))
		require.Equal(t, "order.created", got.Header.Get("X-Outbox-Topic"))
		require.Equal(t, "Bearer t", got.Header.Get("Authorization"))
		require.Equal(t, map[string]any{
			"message_id": "0195c2a0-0000-7000-8000-0000000000aa", "topic": "order.created",
			"payload": map[string]any{"order_id": 7.0}, "created_at": "2026-11-30T09:00:00Z",
		}, body)
	})

	t.Run("StatusClasses", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			code int
			kind delivery.Kind
		}{
			{500, delivery.KindAmbiguous}, {502, delivery.KindAmbiguous}, {504, delivery.KindAmbiguous},
			{503, delivery.KindRetryable}, {408, delivery.KindRetryable}, {429, delivery.KindRetryable},
			{400, delivery.KindPermanent}, {404, delivery.KindPermanent}, {422, delivery.KindPermanent}, {301, delivery.KindPermanent},
		} {
			s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/elsewhere")
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte("no such order"))
			})
			err := s.Send(ctx, testDelivery())
			require.Equal(t, tc.kind, kindOf(t, err).Kind, "HTTP %d", tc.code)
			require.Contains(t, err.Error(), "no such order")
		}
	})

	t.Run("ErrorsLeaveCredentialsOut", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
		defer srv.Close()
		u := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1) + "/events?api_key=s3cr3t"
		s, err := New(Config{URL: u})
		require.NoError(t, err)
		err = s.Send(ctx, testDelivery())
		require.Error(t, err)
		require.NotContains(t, err.Error(), "hunter2")
		require.NotContains(t, err.Error(), "s3cr3t")
		require.Contains(t, err.Error(), strings.TrimPrefix(srv.URL, "http://")+": HTTP 500")
		require.NotContains(t, err.Error(), "/events", "a webhook's path is often its token")
	})

	t.Run("HeadersNoRequestCanCarry", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, value, want string }{
			{"X Tenant", "a", `headers["X Tenant"]: is not an HTTP header name`},
			{"X-Tenant:", "a", `headers["X-Tenant:"]: is not an HTTP header name`},
			{"", "a", `headers[""]: is not an HTTP header name`},
			{"Authorization", "Bearer hunter2\nX-Injected: 1", `headers["Authorization"]: the value holds a control character`},
			{"Authorization", "Bearer hunter2\n", `headers["Authorization"]: the value holds a control character`},
		} {
			_, err := New(Config{URL: "http://127.0.0.1:1/events", Headers: map[string]string{tc.name: tc.value}})
			require.Error(t, err, tc.name)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "hunter2", "a header's value may be a secret")
		}
		_, err := New(Config{URL: "http://127.0.0.1:1/events", Headers: map[string]string{"X-Odd_Name!": "tab\tis fine"}})
		require.NoError(t, err)
	})

	t.Run("HostHeaderNamesTheHost", func(t *testing.T) {
		t.Parallel()
		hosts := make(chan string, 2)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hosts <- r.Host
			w.WriteHeader(http.StatusNotFound)
		}))
		defer srv.Close()
		s, err := New(Config{URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}", Headers: map[string]string{"Host": "orders.internal"}})
		require.NoError(t, err)
		_ = s.Send(ctx, testDelivery())
		_, _ = s.CheckProcessed(ctx, testDelivery())
		require.Equal(t, "orders.internal", <-hosts, "the send")
		require.Equal(t, "orders.internal", <-hosts, "the check")
	})

	t.Run("ARequestLastsAsLongAsItsDeadline", func(t *testing.T) {
		t.Parallel()
		// A topic's timeout may be longer than the backstop for a context without a
		// deadline: the request keeps the context's.
		deadlines := make(chan time.Duration, 1)
		s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })
		base := s.Client.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		s.Client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if d, ok := r.Context().Deadline(); ok {
				deadlines <- time.Until(d)
			} else {
				deadlines <- 0
			}
			return base.RoundTrip(r)
		})
		require.Zero(t, s.Client.Timeout)
		long, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		require.NoError(t, s.Send(long, testDelivery()))
		require.Greater(t, <-deadlines, 9*time.Minute)
		require.NoError(t, s.Send(ctx, testDelivery()))
		got := <-deadlines
		require.Greater(t, got, 4*time.Minute, "a context without a deadline gets the backstop")
		require.LessOrEqual(t, got, backstop)
	})

	t.Run("RetryAfter", func(t *testing.T) {
		t.Parallel()
		s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		})
		herr := kindOf(t, s.Send(ctx, testDelivery()))
		require.Equal(t, 7*time.Second, herr.RetryAfter)

		now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
		require.Equal(t, 90*time.Second, delivery.ParseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
		require.Zero(t, delivery.ParseRetryAfter("soon", now))
		require.Zero(t, delivery.ParseRetryAfter("-3", now))
		year := 365 * 24 * time.Hour
		require.Equal(t, year, delivery.ParseRetryAfter("99999999999", now), "capped")
		require.Equal(t, year, delivery.ParseRetryAfter("99999999999999999999", now), "beyond any int: capped, not ignored")
		require.Zero(t, delivery.ParseRetryAfter("-99999999999999999999", now))
	})

	t.Run("ConnectionRefusedIsNotAmbiguous", func(t *testing.T) {
		t.Parallel()
		// Port 1 (tcpmux): nothing listens there. A port freed by closing a listener may
		// be handed to another test's server before the send.
		s, err := New(Config{URL: "http://127.0.0.1:1/events"})
		require.NoError(t, err)
		require.Equal(t, delivery.KindRetryable, kindOf(t, s.Send(ctx, testDelivery())).Kind)
	})

	t.Run("RepeatOfAWrittenRequestIsAmbiguous", func(t *testing.T) {
		// The receiver takes the second POST on a kept-alive connection and drops the
		// connection before it answers (a pod going away). The client repeats the POST on
		// a new connection, whose dial is refused: the receiver may have the message all
		// the same, so the failure is ambiguous (check first), not "nothing sent".
		t.Parallel()
		var processed atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if processed.Add(1) == 1 {
				return // 200, the connection kept alive
			}
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		var dials atomic.Int32
		dialer := &net.Dialer{}
		s, err := New(Config{URL: srv.URL + "/events"})
		require.NoError(t, err)
		s.Client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			return dialer.DialContext(ctx, network, addr)
		}}}
		require.NoError(t, s.Send(ctx, testDelivery()))
		err = s.Send(ctx, testDelivery())
		require.Equal(t, int32(2), processed.Load(), "the receiver has the second message")
		require.Equal(t, delivery.KindAmbiguous, kindOf(t, err).Kind, "%v", err)
		require.Equal(t, int32(2), dials.Load(), "the client repeated the request on a new connection")

		// A dial that fails before any request was written is still not ambiguous.
		require.Equal(t, delivery.KindRetryable, kindOf(t, s.Send(ctx, testDelivery())).Kind)
	})

	t.Run("OrderingKeyAHeaderCannotCarryIsPermanent", func(t *testing.T) {
		// A row written without Enqueue's check: nothing is sent, and no retry helps.
		t.Parallel()
		var posts atomic.Int32
		s := sinkFor(t, func(http.ResponseWriter, *http.Request) { posts.Add(1) })
		d := testDelivery()
		d.OrderingKey = "order\n42"
		err := s.Send(ctx, d)
		require.Equal(t, delivery.KindPermanent, kindOf(t, err).Kind, "%v", err)
		require.ErrorContains(t, err, "control character")
		require.Zero(t, posts.Load())
	})

	t.Run("TimeoutIsAmbiguous", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		require.Equal(t, delivery.KindAmbiguous, kindOf(t, s.Send(tctx, testDelivery())).Kind)
	})

	t.Run("CheckProcessed", func(t *testing.T) {
		t.Parallel()
		s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
			require.Equal(t, http.MethodGet, r.Method)
			switch r.URL.Path {
			case "/events/0195c2a0-0000-7000-8000-0000000000aa":
				w.WriteHeader(http.StatusOK)
			default:
				w.WriteHeader(http.StatusNotFound)
			}
		})
		processed, err := s.CheckProcessed(ctx, testDelivery())
		require.NoError(t, err)
		require.True(t, processed)
		other := testDelivery()
		other.MessageID = uuid.NewString()
		processed, err = s.CheckProcessed(ctx, other)
		require.NoError(t, err)
		require.False(t, processed)

		s.CheckURL = ""
		_, err = s.CheckProcessed(ctx, other)
		require.True(t, errors.Is(err, delivery.ErrCheckUnsupported))
	})
}

// received is a request as a test receiver saw it.
type received struct {
	header http.Header
	body   []byte
}

// signedSink returns a sink signing with secrets (in their text form) that POSTs to a
// receiver recording every request, and the receiver's requests so far.
func signedSink(t *testing.T, secrets ...string) (*Sink, func() []received) {
	t.Helper()
	var mu sync.Mutex
	var got []received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, received{header: r.Header.Clone(), body: body})
		mu.Unlock()
		if r.Method == http.MethodGet {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	cfg := Config{
		URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}",
		// A header of the same name as a signature header does not replace it.
		Headers: map[string]string{"Authorization": "Bearer t", webhook.HeaderID: "spoofed"},
	}
	for _, secret := range secrets {
		key, err := webhook.ParseSecret(secret)
		require.NoError(t, err)
		cfg.SigningSecrets = append(cfg.SigningSecrets, key)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	return s, func() []received {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func verifier(t *testing.T, secrets ...string) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(secrets...)
	require.NoError(t, err)
	return v
}

// A check_url without {message_id} is refused, as the config file refuses it: it would ask
// one URL about every message, and its 200 would record messages sent that never arrived.
func TestCheckURLNamesTheMessage(t *testing.T) {
	_, err := New(Config{URL: "https://receiver/events", CheckURL: "https://receiver/health"})
	require.ErrorContains(t, err, "check_url: must contain {message_id}")
	_, err = New(Config{URL: "https://receiver/events", CheckURL: "https://receiver/events/{message_id}"})
	require.NoError(t, err)
}

func TestHTTPSinkSigning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReceiverVerifies", func(t *testing.T) {
		t.Parallel()
		secret := webhook.NewSecret()
		s, requests := signedSink(t, secret)
		require.NoError(t, s.Send(ctx, testDelivery()))
		got := requests()
		require.Len(t, got, 1)
		r := got[0]
		require.NoError(t, verifier(t, secret).Verify(r.header, r.body))
		require.ErrorIs(t, verifier(t, webhook.NewSecret()).Verify(r.header, r.body), webhook.ErrSignature)

		require.Equal(t, "0195c2a0-0000-7000-8000-0000000000aa", r.header.Get(webhook.HeaderID))
		ts, err := strconv.ParseInt(r.header.Get(webhook.HeaderTimestamp), 10, 64)
		require.NoError(t, err)
		require.WithinDuration(t, time.Now(), time.Unix(ts, 0), time.Minute)
		require.Equal(t, "Bearer t", r.header.Get("Authorization"))

		// The signature covers the body as sent, byte for byte.
		changed := slices.Clone(r.body)
		changed[len(changed)-3] ^= 1
		require.ErrorIs(t, verifier(t, secret).Verify(r.header, changed), webhook.ErrSignature)
	})

	t.Run("SameIDOnEveryAttempt", func(t *testing.T) {
		t.Parallel()
		secret := webhook.NewSecret()
		s, requests := signedSink(t, secret)
		d := testDelivery()
		d.Attempt = 1
		require.NoError(t, s.Send(ctx, d))
		d.Attempt = 2
		require.NoError(t, s.Send(ctx, d))
		got := requests()
		require.Len(t, got, 2)
		v := verifier(t, secret)
		for i, r := range got {
			require.NoError(t, v.Verify(r.header, r.body), "attempt %d", i+1)
			require.Equal(t, d.MessageID, r.header.Get(webhook.HeaderID), "attempt %d", i+1)
			require.Equal(t, strconv.Itoa(i+1), r.header.Get("Outbox-Attempt"))
		}
	})

	t.Run("TwoSecrets", func(t *testing.T) {
		t.Parallel()
		old, next := webhook.NewSecret(), webhook.NewSecret()
		s, requests := signedSink(t, old, next)
		require.NoError(t, s.Send(ctx, testDelivery()))
		r := requests()[0]
		require.Len(t, strings.Fields(r.header.Get(webhook.HeaderSignature)), 2)
		require.NoError(t, verifier(t, old).Verify(r.header, r.body))
		require.NoError(t, verifier(t, next).Verify(r.header, r.body))
		require.ErrorIs(t, verifier(t, webhook.NewSecret()).Verify(r.header, r.body), webhook.ErrSignature)
	})

	t.Run("CheckIsNotSigned", func(t *testing.T) {
		t.Parallel()
		s, requests := signedSink(t, webhook.NewSecret())
		processed, err := s.CheckProcessed(ctx, testDelivery())
		require.NoError(t, err)
		require.False(t, processed)
		r := requests()[0]
		require.Empty(t, r.header.Get(webhook.HeaderSignature))
		require.Empty(t, r.header.Get(webhook.HeaderTimestamp))
	})

	t.Run("UnsignedWithoutSecrets", func(t *testing.T) {
		t.Parallel()
		s, requests := signedSink(t)
		require.NoError(t, s.Send(ctx, testDelivery()))
		r := requests()[0]
		require.Empty(t, r.header.Get(webhook.HeaderSignature))
		require.Empty(t, r.header.Get(webhook.HeaderTimestamp))
		require.ErrorIs(t, verifier(t, webhook.NewSecret()).Verify(r.header, r.body), webhook.ErrMissingHeaders)
	})

	t.Run("EmptyKeyRejected", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{URL: "http://receiver/events", SigningSecrets: [][]byte{[]byte("k"), nil}})
		require.ErrorContains(t, err, "signing_secrets[1]")
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

package activities

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func testDelivery() Delivery {
	return Delivery{
		MessageID: uuid.MustParse("0195c2a0-0000-7000-8000-0000000000aa"), Topic: "order.created",
		Payload: json.RawMessage(`{"order_id":7}`), CreatedAt: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC),
		Attempt: 2, MaxAttempts: 4,
	}
}

func sinkFor(t *testing.T, h http.HandlerFunc) *HTTPSink {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s, err := NewHTTPSink(SinkConfig{URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}", Headers: map[string]string{"Authorization": "Bearer t"}})
	require.NoError(t, err)
	return s
}

func kindOf(t *testing.T, err error) *HandlerError {
	t.Helper()
	var herr *HandlerError
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
		require.Equal(t, "2", got.Header.Get("X-Outbox-Attempt"))
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
			kind int
		}{
			{500, kindAmbiguous}, {502, kindAmbiguous}, {504, kindAmbiguous},
			{503, kindRetryable}, {408, kindRetryable}, {429, kindRetryable},
			{400, kindPermanent}, {404, kindPermanent}, {422, kindPermanent}, {301, kindPermanent},
		} {
			s := sinkFor(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/elsewhere")
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte("no such order"))
			})
			err := s.Send(ctx, testDelivery())
			require.Equal(t, tc.kind, kindOf(t, err).kind, "HTTP %d", tc.code)
			require.Contains(t, err.Error(), "no such order")
		}
	})

	t.Run("ErrorsLeaveCredentialsOut", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
		defer srv.Close()
		u := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1) + "/events?api_key=s3cr3t"
		s, err := NewHTTPSink(SinkConfig{URL: u})
		require.NoError(t, err)
		err = s.Send(ctx, testDelivery())
		require.Error(t, err)
		require.NotContains(t, err.Error(), "hunter2")
		require.NotContains(t, err.Error(), "s3cr3t")
		require.Contains(t, err.Error(), "/events: HTTP 500")

		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		closed := "http://" + l.Addr().String() + "/hook/T000/B000/s3cr3t-token"
		require.NoError(t, l.Close())
		alertErr := (&AlertWebhooks{Global: closed}).Send(ctx, DeadLetterAlert{Topic: "t"})
		require.Error(t, alertErr)
		require.NotContains(t, alertErr.Error(), "s3cr3t")
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
		require.Equal(t, 90*time.Second, retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
		require.Zero(t, retryAfter("soon", now))
		require.Zero(t, retryAfter("-3", now))
	})

	t.Run("ConnectionRefusedIsNotAmbiguous", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		s, err := NewHTTPSink(SinkConfig{URL: "http://" + addr + "/events"})
		require.NoError(t, err)
		require.Equal(t, kindRetryable, kindOf(t, s.Send(ctx, testDelivery())).kind)
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
		require.Equal(t, kindAmbiguous, kindOf(t, s.Send(tctx, testDelivery())).kind)
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
		other.MessageID = uuid.New()
		processed, err = s.CheckProcessed(ctx, other)
		require.NoError(t, err)
		require.False(t, processed)

		s.CheckURL = ""
		_, err = s.CheckProcessed(ctx, other)
		require.True(t, errors.Is(err, ErrCheckUnsupported))
	})
}

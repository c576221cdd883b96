package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestTracing follows one message through the real system with the global tracer
// provider recording: the send span continues the enqueuing span's trace, links to the
// activity span of the workflow's trace (which the Temporal client's tracing interceptor
// makes), and the receiver gets a traceparent of the enqueuing trace.
//
// It sets the global tracer provider, so it does not run in parallel: parallel tests
// start after it has finished and restored the no-op provider.
func TestTracing(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		_ = tp.Shutdown(context.Background())
	})

	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)
	traceparents := make(chan string, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		traceparents <- r.Header.Get("traceparent")
	}))
	t.Cleanup(recv.Close)

	a, err := app.Open(ctx, &config.Config{
		DatabaseURL: testdb.URL(),
		Schema:      e.store.Schema(),
		Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
		Relay:       config.Relay{PollInterval: config.Duration(200 * time.Millisecond)},
		Topics:      map[string]config.Topic{"order.created": {Sink: "http", URL: recv.URL}},
	}, app.Options{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	require.NoError(t, a.DialTemporal(ctx))
	e.run(t, func(ctx context.Context) error { return a.RunWorker(ctx, app.Handlers{}) })
	e.run(t, a.RunRelay)

	enqCtx, enqSpan := tp.Tracer("shop").Start(ctx, "place order")
	id, err := e.store.Enqueue(enqCtx, e.pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{"order": 1}`)})
	require.NoError(t, err)
	enqSpan.End()
	e.waitStatus(t, id, store.StatusSent)

	byName := func(name string) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range spans.Ended() {
			if s.Name() == name {
				out = append(out, s)
			}
		}
		return out
	}
	require.Eventually(t, func() bool {
		return len(byName("outbox.send order.created")) == 1 && len(byName("RunActivity:OutboxSend")) == 1 &&
			len(byName("StartWorkflow:OutboxDelivery")) == 1
	}, 10*time.Second, 50*time.Millisecond)

	send := byName("outbox.send order.created")[0]
	activity := byName("RunActivity:OutboxSend")[0]
	start := byName("StartWorkflow:OutboxDelivery")[0]
	enq := enqSpan.SpanContext()

	require.Equal(t, enq.TraceID(), send.SpanContext().TraceID())
	require.Equal(t, enq.SpanID(), send.Parent().SpanID())
	require.Len(t, send.Links(), 1)
	require.Equal(t, activity.SpanContext().SpanID(), send.Links()[0].SpanContext.SpanID())
	// The workflow's trace starts at the relay's start.
	require.Equal(t, start.SpanContext().TraceID(), activity.SpanContext().TraceID())
	require.Equal(t, trace.SpanKindClient, send.SpanKind())

	got := <-traceparents
	parts := strings.Split(got, "-")
	require.Len(t, parts, 4, "traceparent %q", got)
	require.Equal(t, enq.TraceID().String(), parts[1])
	require.Equal(t, send.SpanContext().SpanID().String(), parts[2])
}

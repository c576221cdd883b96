package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// observed is one activity set wired to a receiver, a span recorder and a metrics
// registry.
type observed struct {
	a       *activities.Activities
	st      *store.Store
	spans   *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	reg     *prometheus.Registry
	headers chan http.Header
}

func setupObserved(t *testing.T, status int) *observed {
	t.Helper()
	_, st := testdb.Schema(t)
	o := &observed{st: st, spans: tracetest.NewSpanRecorder(), reg: prometheus.NewRegistry(), headers: make(chan http.Header, 10)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.headers <- r.Header.Clone()
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	handlers, err := (&config.Config{Topics: map[string]config.Topic{
		"order.created": {Sink: "http", URL: srv.URL},
	}}).Registry(nil)
	require.NoError(t, err)
	m, err := metrics.New(o.reg)
	require.NoError(t, err)
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	t.Cleanup(func() { _ = o.tp.Shutdown(context.Background()) })
	o.a = &activities.Activities{Store: st, Handlers: handlers, Metrics: m, TracerProvider: o.tp}
	return o
}

// createdTopic declares order.created to the metrics and returns its series' labels.
func (o *observed) createdTopic() map[string]string {
	o.a.Metrics.KnownTopics("order.created")
	return map[string]string{"topic": "order.created"}
}

// enqueue enqueues a message of order.created and returns its ID.
func (o *observed) enqueue(t *testing.T) string {
	t.Helper()
	id, err := o.st.Enqueue(context.Background(), o.st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	return id.String()
}

func (o *observed) sendSpan(t *testing.T) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range o.spans.Ended() {
		if s.Name() == "outbox.send order.created" {
			return s
		}
	}
	t.Fatal("no outbox.send span ended")
	return nil
}

// value returns the value of the series name{labels}, 0 when it does not exist.
func (o *observed) value(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := o.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return metricValue(m)
		}
	}
	return 0
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

func TestSendTracing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SendSpanIsAChildOfTheEnqueuingSpan", func(t *testing.T) {
		t.Parallel()
		o := setupObserved(t, http.StatusOK)
		enqCtx, enqSpan := o.tp.Tracer("shop").Start(ctx, "place order")
		id, err := o.st.Enqueue(enqCtx, o.st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{"order": 7}`)})
		require.NoError(t, err)
		enqSpan.End()

		// Under Temporal's tracing interceptor the activity runs inside the workflow's
		// trace: a span of another trace.
		actCtx, actSpan := o.tp.Tracer("temporal").Start(ctx, "RunActivity:OutboxSend")
		require.NoError(t, sendOnce(actCtx, o.a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 4}))
		actSpan.End()
		require.NotEqual(t, enqSpan.SpanContext().TraceID(), actSpan.SpanContext().TraceID())

		send := o.sendSpan(t)
		require.Equal(t, enqSpan.SpanContext().TraceID(), send.SpanContext().TraceID())
		require.Equal(t, enqSpan.SpanContext().SpanID(), send.Parent().SpanID())
		require.True(t, send.Parent().IsRemote())
		require.Len(t, send.Links(), 1)
		require.Equal(t, actSpan.SpanContext().SpanID(), send.Links()[0].SpanContext.SpanID())
		require.Equal(t, codes.Unset, send.Status().Code)
		require.Contains(t, send.Attributes(), attribute.String("messaging.message.id", id.String()))

		// The receiver's span would be a child of the send span, in the enqueuing trace.
		h := <-o.headers
		parts := strings.Split(h.Get("traceparent"), "-")
		require.Len(t, parts, 4, "traceparent %q", h.Get("traceparent"))
		require.Equal(t, enqSpan.SpanContext().TraceID().String(), parts[1])
		require.Equal(t, send.SpanContext().SpanID().String(), parts[2])
		require.Equal(t, id.String(), h.Get("Idempotency-Key"))
	})

	t.Run("WithoutTraceHeadersTheActivitySpanIsTheParent", func(t *testing.T) {
		t.Parallel()
		o := setupObserved(t, http.StatusOK)
		id, err := o.st.Enqueue(ctx, o.st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		actCtx, actSpan := o.tp.Tracer("temporal").Start(ctx, "RunActivity:OutboxSend")
		require.NoError(t, sendOnce(actCtx, o.a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 4}))
		actSpan.End()
		send := o.sendSpan(t)
		require.Equal(t, actSpan.SpanContext().SpanID(), send.Parent().SpanID())
		require.Empty(t, send.Links())
		require.Contains(t, (<-o.headers).Get("traceparent"), actSpan.SpanContext().TraceID().String())
	})

	t.Run("FailedSendMarksTheSpan", func(t *testing.T) {
		t.Parallel()
		o := setupObserved(t, http.StatusBadRequest)
		enqCtx, enqSpan := o.tp.Tracer("shop").Start(ctx, "place order")
		id, err := o.st.Enqueue(enqCtx, o.st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		enqSpan.End()
		require.Error(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 4}))
		send := o.sendSpan(t)
		require.Equal(t, codes.Error, send.Status().Code)
		require.Contains(t, send.Status().Description, "HTTP 400")
		require.Contains(t, send.Attributes(), attribute.String("outbox.failure_kind", "permanent"))
	})
}

func TestActivityMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := setupObserved(t, http.StatusOK)
	o.a.Metrics.KnownTopics("order.created")
	enqueue := func(topic string) string {
		id, err := o.st.Enqueue(ctx, o.st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return id.String()
	}

	sent := enqueue("order.created")
	require.NoError(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: sent, Topic: "order.created", Attempt: 1, MaxAttempts: 4}))
	require.NoError(t, o.a.MarkSent(ctx, workflows.MarkSentInput{MessageID: sent, Attempts: 1}))
	require.NoError(t, o.a.MarkSent(ctx, workflows.MarkSentInput{MessageID: sent, Attempts: 1}), "a repeated mark-sent")

	unknown := enqueue("order.unrouted")
	require.Error(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: unknown, Topic: "order.unrouted", Attempt: 1, MaxAttempts: 4}))
	_, err := o.a.DeadLetter(ctx, workflows.DeadLetterInput{
		MessageID: unknown, Topic: "order.unrouted", WorkflowID: workflows.WorkflowID(unknown), RunID: "run-1", Attempts: 1, LastError: "no handler",
	})
	require.NoError(t, err)

	created := map[string]string{"topic": "order.created"}
	unrouted := map[string]string{"topic": metrics.OtherTopic} // no topic of the worker's
	require.Equal(t, 1.0, o.value(t, "outbox_send_attempts_total", created))
	require.Equal(t, 1.0, o.value(t, "outbox_send_attempts_total", unrouted))
	require.Equal(t, 1.0, o.value(t, "outbox_messages_sent_total", created), "a repeated mark-sent counts once")
	require.Equal(t, 1.0, o.value(t, "outbox_commit_to_sent_seconds", created))
	require.Equal(t, 1.0, o.value(t, "outbox_send_failures_total", map[string]string{"topic": metrics.OtherTopic, "kind": "unknown_topic"}))
	require.Equal(t, 1.0, o.value(t, "outbox_messages_dead_lettered_total", unrouted))
	require.Equal(t, 0.0, o.value(t, "outbox_errors_total", map[string]string{"operation": metrics.OpMarkSent}))
}

// A send that sends nothing (its topic is paused, or its message is recorded sent
// already) is no attempt; a failure is counted once however many tries recording it on
// the row takes (RecordFailure is retried while the database fails).
func TestMetricsCountOnlyWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := setupObserved(t, http.StatusOK)
	created := o.createdTopic()

	paused := o.enqueue(t)
	_, _, err := o.st.PauseTopic(ctx, "order.created", "ops", "")
	require.NoError(t, err)
	err = sendOnce(ctx, o.a, workflows.SendInput{MessageID: paused, Topic: "order.created", Attempt: 1, MaxAttempts: 4})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, workflows.ErrTypeTopicPaused, appErr.Type())
	require.Equal(t, 0.0, o.value(t, "outbox_send_attempts_total", created), "a paused topic's send is no attempt")
	_, _, err = o.st.ResumeTopic(ctx, "order.created")
	require.NoError(t, err)

	require.NoError(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: paused, Topic: "order.created", Attempt: 1, MaxAttempts: 4}))
	require.Equal(t, 1.0, o.value(t, "outbox_send_attempts_total", created))
	require.NoError(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: paused, Topic: "order.created", Attempt: 2, MaxAttempts: 4}),
		"a second run of a message recorded sent")
	require.Equal(t, 1.0, o.value(t, "outbox_send_attempts_total", created), "a message recorded sent is not sent again")

	failed := o.enqueue(t)
	in := workflows.RecordFailureInput{MessageID: failed, Topic: "order.created", Attempt: 1, Error: "HTTP 502", ErrType: workflows.ErrTypeRetryable}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, o.a.RecordFailure(gone, in), "the database step fails")
	require.NoError(t, o.a.RecordFailure(ctx, in), "its retry")
	require.Equal(t, 1.0, o.value(t, "outbox_send_failures_total", created))
}

// A team's attempts (its activity, workflow or Nexus operation; no send activity of the
// outbox runs them) count as attempts: a failed one when RecordFailure records it, the one
// that delivers when mark-sent records the row sent, once however often mark-sent runs.
func TestTeamAttemptsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := setupObserved(t, http.StatusOK)
	created := o.createdTopic()
	id := o.enqueue(t)

	require.NoError(t, o.a.RecordFailure(ctx, workflows.RecordFailureInput{MessageID: id, Topic: "order.created", Attempt: 1, Error: "reserve stock: timeout", ErrType: workflows.ErrTypeRetryable}))
	require.NoError(t, o.a.MarkSent(ctx, workflows.MarkSentInput{MessageID: id, Attempts: 2, TeamAttempt: true}))
	require.NoError(t, o.a.MarkSent(ctx, workflows.MarkSentInput{MessageID: id, Attempts: 2, TeamAttempt: true}), "a retried mark-sent")
	require.Equal(t, 2.0, o.value(t, "outbox_send_attempts_total", created))
	require.Equal(t, 1.0, o.value(t, "outbox_send_failures_total", created))
	require.Equal(t, 1.0, o.value(t, "outbox_messages_sent_total", created))
}

// TestConnectionLostIsCounted: a send that failed with its broker connection (the sink
// wraps delivery.ErrConnectionLost) counts in outbox_send_connection_lost_total, besides
// the attempt's failure; a failure of the message's own does not.
func TestConnectionLostIsCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := setupObserved(t, http.StatusOK)
	o.a.Metrics.KnownTopics("order.queued")
	calls := 0
	o.a.Handlers.Handle("order.queued", delivery.HandlerFunc(func(context.Context, delivery.Message) error {
		calls++
		if calls == 1 {
			return delivery.Ambiguous(fmt.Errorf("rabbitmq: publish to amqp://rabbit:5672: %w", delivery.ErrConnectionLost))
		}
		return delivery.Permanent(errors.New("unroutable"))
	}))
	for range 2 {
		id, err := o.st.Enqueue(ctx, o.st.DB(), store.Message{Topic: "order.queued", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		require.Error(t, sendOnce(ctx, o.a, workflows.SendInput{MessageID: id.String(), Topic: "order.queued", Attempt: 1, MaxAttempts: 4}))
	}
	queued := map[string]string{"topic": "order.queued"}
	require.Equal(t, 1.0, o.value(t, "outbox_send_connection_lost_total", queued))
	require.Equal(t, 1.0, o.value(t, "outbox_send_failures_total", map[string]string{"topic": "order.queued", "kind": "ambiguous"}))
	require.Equal(t, 1.0, o.value(t, "outbox_send_failures_total", map[string]string{"topic": "order.queued", "kind": "permanent"}))
}

// recordingBatch is a batch handler that records, per message, the trace context a
// broker sink would write into it (sinks.Headers), as Kafka's and NATS's batch publishes
// do.
type recordingBatch struct {
	mu          sync.Mutex
	traceparent map[string]string // message ID → traceparent written
}

func (r *recordingBatch) Send(ctx context.Context, m delivery.Message) error {
	return r.SendBatch(ctx, []delivery.Message{m})[0]
}

func (r *recordingBatch) SendBatch(ctx context.Context, msgs []delivery.Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		h, err := sinks.Headers(ctx, m, nil, sinks.Reserved{})
		errs[i] = err
		r.traceparent[m.MessageID] = h["traceparent"]
	}
	return errs
}

// TestBatchSendTracing sends a batch lane's messages through a batch handler under the
// batch run's activity span: each message goes out with the trace context of its own send
// span, a child of the span that enqueued it, as a single send's does, not with the batch
// run's.
func TestBatchSendTracing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := setupObserved(t, http.StatusOK)
	rec := &recordingBatch{traceparent: map[string]string{}}
	reg := activities.NewRegistry()
	reg.Handle("clicks", rec)
	o.a.Handlers = reg

	var enqSpans []trace.Span
	var ids []uuid.UUID
	for range 3 {
		enqCtx, span := o.tp.Tracer("shop").Start(ctx, "place order")
		id, err := o.st.Enqueue(enqCtx, o.st.DB(), store.Message{Topic: "clicks", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		span.End()
		enqSpans, ids = append(enqSpans, span), append(ids, id)
	}
	const batch = "outbox-batch-traced"
	claim, err := o.st.ClaimBatch(ctx, 10, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	for i := range claim.Claimed {
		claim.Claimed[i].Batch = batch
	}
	_, err = o.st.MarkDispatchedAll(ctx, claim.Claimed)
	require.NoError(t, err)

	actCtx, actSpan := o.tp.Tracer("temporal").Start(ctx, "RunActivity:OutboxSendBatch")
	in := workflows.SendBatchInput{Batch: batch, Topic: "clicks", MaxAttempts: 12, Concurrency: 4, SendTimeout: 5 * time.Second}
	for _, id := range ids {
		in.Messages = append(in.Messages, workflows.BatchMessage{MessageID: id.String()})
	}
	out, err := o.a.SendBatch(actCtx, in)
	require.NoError(t, err)
	actSpan.End()
	for _, oc := range out.Outcomes {
		require.Equal(t, workflows.BatchSent, oc.Outcome, "%+v", oc)
	}

	sends := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range o.spans.Ended() {
		if s.Name() == "outbox.send clicks" {
			for _, a := range s.Attributes() {
				if a.Key == "messaging.message.id" {
					sends[a.Value.AsString()] = s
				}
			}
		}
	}
	for i, id := range ids {
		send, ok := sends[id.String()]
		require.True(t, ok, "message %d has its send span", i)
		require.Equal(t, enqSpans[i].SpanContext().TraceID(), send.SpanContext().TraceID(), "message %d: the enqueuing trace", i)
		parts := strings.Split(rec.traceparent[id.String()], "-")
		require.Len(t, parts, 4, "message %d: traceparent %q", i, rec.traceparent[id.String()])
		require.Equal(t, enqSpans[i].SpanContext().TraceID().String(), parts[1], "message %d goes out in the trace that enqueued it", i)
		require.Equal(t, send.SpanContext().SpanID().String(), parts[2], "as a child of its send span")
	}
}

package activities

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/internal/tracing"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// tracerName names the tracer of the send span.
const tracerName = "github.com/outbox-go/outbox/activities"

// startSendSpan starts the span "outbox.send <topic>" around one send attempt. Its parent
// is the span that enqueued the message, read from the row's headers, so the delivery
// joins the trace of the business transaction; the span links to the activity's own span
// (the Temporal workflow's trace) when there is one. Without trace headers its parent is
// the activity's span.
func (a *Activities) startSendSpan(ctx context.Context, row store.Row, in workflows.SendInput) (context.Context, trace.Span) {
	tp := a.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("messaging.system", "outbox"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", row.Topic),
			attribute.String("messaging.message.id", row.MessageID.String()),
			attribute.Int("outbox.attempt", in.Attempt),
			attribute.Int("outbox.max_attempts", in.MaxAttempts),
		),
	}
	if parent := tracing.SpanContext(nil, row.Headers); parent.IsValid() {
		if link := trace.LinkFromContext(ctx); link.SpanContext.IsValid() {
			opts = append(opts, trace.WithLinks(link))
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	return tp.Tracer(tracerName).Start(ctx, "outbox.send "+row.Topic, opts...)
}

// endSendSpan records a failed attempt on its span.
func endSendSpan(span trace.Span, err error) {
	msg := err.Error()
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		msg = appErr.Message()
		span.SetAttributes(attribute.String("outbox.failure_kind", metrics.FailureKind(appErr.Type())),
			attribute.Bool("outbox.retryable", !appErr.NonRetryable()))
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, msg)
}

// markSent moves the message to sent and counts it, with its commit-to-sent latency
// (sent_at − created_at, both from the database clock). sent is nil when the row was
// already terminal.
func (a *Activities) markSent(ctx context.Context, id uuid.UUID) (sent *store.Sent, err error) {
	sent, err = a.Store.RecordSent(ctx, id)
	if err != nil {
		a.Metrics.Error(metrics.OpMarkSent)
		return nil, err
	}
	if sent != nil {
		a.Metrics.Sent(sent.Topic, sent.Latency)
	}
	return sent, nil
}

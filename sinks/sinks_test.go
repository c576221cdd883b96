package sinks_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"amqp://outbox:Sup3r#Secret@rabbit:5672/vhost":  "amqp://rabbit:5672",
		"nats://outbox:Sup3r?Secret@127.0.0.1:4222":     "nats://127.0.0.1:4222",
		"amqps://u:pa/ss@rabbit.internal:5671/?x=1":     "amqps://rabbit.internal:5671",
		"nats://127.0.0.1:4222":                         "nats://127.0.0.1:4222",
		"tls://token@nats.internal:4222":                "tls://nats.internal:4222",
		"not a url":                                     "(unparsable URL)",
		"amqp://rabbit:5672/vhost?auth_mechanism=plain": "amqp://rabbit:5672",
	} {
		require.Equal(t, want, redact.URL(raw), raw)
	}
}

func TestTemplate(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("01937f4e-1c2d-7a3b-9f10-2b6c8d4e5f60")
	d := delivery.Message{MessageID: id.String(), Topic: "order.created", OrderingKey: "customer-7"}

	tmpl, err := sinks.ParseTemplate("orders.{topic}.{ordering_key}.{message_id}")
	require.NoError(t, err)
	require.False(t, tmpl.Static())
	got, err := tmpl.Expand(d)
	require.NoError(t, err)
	require.Equal(t, "orders.order.created.customer-7."+id.String(), got)

	d.OrderingKey = ""
	_, err = tmpl.Expand(d)
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "has no ordering key")

	static, err := sinks.ParseTemplate("orders")
	require.NoError(t, err)
	require.True(t, static.Static())

	_, err = sinks.ParseTemplate("orders.{key}")
	require.ErrorContains(t, err, "unknown placeholder {key}")
	_, err = sinks.ParseTemplate("orders.{topic")
	require.ErrorContains(t, err, "unbalanced brace")
}

// A broker message carries the send span's trace context, not the one the row was
// enqueued with, whatever the case of the row's header names, and not a stale tracestate.
func TestHeadersCarryTheSendSpansTraceContext(t *testing.T) {
	send := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), send)
	d := delivery.Message{MessageID: uuid.NewString(), Topic: "order.created", Headers: map[string]string{
		"traceparent": "00-ffffffffffffffffffffffffffffffff-eeeeeeeeeeeeeeee-01",
		"tracestate":  "vendor=stale",
		"Traceparent": "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01",
		"X-Tenant":    "acme",
	}}
	h, err := sinks.Headers(ctx, d, nil, sinks.KafkaReserved)
	require.NoError(t, err)
	require.Equal(t, "00-"+send.TraceID().String()+"-"+send.SpanID().String()+"-01", h["traceparent"])
	require.NotContains(t, h, "tracestate")
	require.NotContains(t, h, "Traceparent")
	require.Equal(t, "acme", h["X-Tenant"], "the message's other headers stay")

	// Without a span, the message's own trace context goes on.
	h, err = sinks.Headers(context.Background(), d, nil, sinks.KafkaReserved)
	require.NoError(t, err)
	require.Equal(t, d.Headers["traceparent"], h["traceparent"])
}

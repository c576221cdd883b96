package sinks_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

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

package rabbitsink_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
)

// TestRowHeadersCannotSteerTheBroker: CC and BCC in a message's headers would route it to
// more queues (and a malformed one closes the channel), x-* headers are read by plugins
// and queues (x-delay, x-deduplication-header): a row cannot set them. The send fails
// permanently, naming the header, and no queue receives anything.
func TestRowHeadersCannotSteerTheBroker(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("orders")
	q := b.queue("orders", ex, nil, "orders")
	other := b.queue("other", ex, nil, "other")
	s := newSink(t, "orders", rabbitsink.Config{Exchange: ex, RoutingKey: "orders"})

	for _, header := range []string{"CC", "BCC", "x-delay", "x-deduplication-header", "Outbox-Attempt", "outbox-message-id"} {
		d := testMessage("orders", 1)
		d.Headers[header] = "other"
		err := s.Send(ctxFor(t), d)
		require.Error(t, err, header)
		require.True(t, delivery.IsPermanent(err), "%s: %v", header, err)
		require.ErrorContains(t, err, `header "`+header+`"`)
	}
	require.Zero(t, b.depth(q))
	require.Zero(t, b.depth(other), "a CC from a row routed nowhere")

	// Names the broker does not act on pass: it compares CC and x- exactly.
	d := testMessage("orders", 2)
	d.Headers["cc-team"] = "a"
	d.Headers["X-Request-Id"] = "b"
	require.NoError(t, s.Send(ctxFor(t), d))
	eventually(t, 5e9, "the message reaches its queue", func() bool { return b.depth(q) == 1 })
	require.Zero(t, b.depth(other))
}

package kafkasink_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/kafkasink"
)

// TestRowHeadersCannotSetTheOutboxHeaders: a Kafka header steers nothing at the broker,
// but consumers read the Outbox-* headers (the message ID they de-duplicate by): a row
// cannot set them, in any case, and its key and topic come from the sink alone.
func TestRowHeadersCannotSetTheOutboxHeaders(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	s := openSink(t, c, kafkasink.Config{})
	for _, header := range []string{sinks.HeaderMessageID, "outbox-message-id", "OUTBOX-TOPIC"} {
		d := testMessage("orders", "k", 0)
		d.Headers[header] = "forged"
		err := s.Send(sendCtx(t, 10*time.Second), d)
		require.Error(t, err, header)
		require.True(t, delivery.IsPermanent(err), "%s: %v", header, err)
		require.ErrorContains(t, err, `header "`+header+`"`)
	}
	d := testMessage("orders", "k", 1)
	d.Headers["Key"] = "other-key"
	d.Headers["Topic"] = "other-topic"
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), d))
	recs := consume(t, c, "orders", 1)
	require.Len(t, recs, 1, "only the message without a reserved header was produced")
	require.Equal(t, "k", string(recs[0].Key))
	require.Equal(t, "orders", recs[0].Topic)
}

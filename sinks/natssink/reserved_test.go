package natssink_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks/natssink"
)

// TestRowHeadersCannotSteerTheStream: a row's headers are written by whoever writes the
// row, so a Nats-Rollup in them must not purge other messages of the subject, and a
// Nats-Expected-* must not make every attempt fail until the message dies: the send fails
// permanently at once, naming the header, and the stream is untouched.
func TestRowHeadersCannotSteerTheStream(t *testing.T) {
	t.Parallel()
	js, _, prefix := stream(t)
	ctx := context.Background()
	name := prefix + "_rollup"
	st, err := testutil.CreateStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowRollup: true, Duplicates: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

	s := newSink(t, natssink.Config{Subject: name + ".orders"})
	for range 3 {
		require.NoError(t, s.Send(ctx, message("orders", "")))
	}
	for _, header := range []string{"Nats-Rollup", "nats-rollup", "Nats-Expected-Last-Sequence", "Nats-Msg-Id", "Outbox-Message-Id", "outbox-topic"} {
		d := message("orders", "")
		d.Headers[header] = "sub"
		err := s.Send(ctx, d)
		require.Error(t, err, header)
		require.True(t, delivery.IsPermanent(err), "%s: %v", header, err)
		require.ErrorContains(t, err, `header "`+header+`"`)
	}
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, info.State.Msgs, "the earlier messages are all there, and nothing was added")

	// Headers of the row's own are carried as before.
	d := message("orders", "")
	d.Headers["X-Tenant"] = "t2"
	require.NoError(t, s.Send(ctx, d))
	got := fetchAll(t, st, 4)
	require.Equal(t, "t2", got[3].Headers().Get("X-Tenant"))
}

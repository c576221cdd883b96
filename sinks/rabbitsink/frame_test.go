package rabbitsink_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
)

// TestHeadersOverTheFrameSize sends a message whose properties and headers take more
// than a frame (the broker's frame_max, 128 KiB by default), which the client would write
// all the same and the broker would answer by closing the connection: the send fails
// permanently before anything is written, naming the limit, and the publishes in flight
// on the connection are confirmed. Headers that fill most of a frame are published.
func TestHeadersOverTheFrameSize(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("frame")
	topic := b.name + ".frame"
	q := b.queue("frame", ex, nil, topic)
	s := newSink(t, topic, rabbitsink.Config{Exchange: ex})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	port := s.LocalPort()

	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range 15 {
		wg.Go(func() {
			if err := s.Send(ctx, testMessage(topic, i)); err != nil {
				failed.Add(1)
				t.Errorf("an ordinary send beside the oversized one: %v", err)
			}
		})
	}
	big := testMessage(topic, 99)
	big.Headers = map[string]string{"Big": strings.Repeat("x", 140<<10)}
	err := s.Send(ctx, big)
	if !delivery.IsPermanent(err) || !strings.Contains(err.Error(), "frame_max 131072") {
		t.Fatalf("a message no frame can carry: %v (%v), want a permanent failure naming frame_max", err, delivery.KindOf(err))
	}
	wg.Wait()
	if failed.Load() > 0 || s.LocalPort() != port {
		t.Fatalf("%d ordinary sends failed; connection on port %d, was %d", failed.Load(), s.LocalPort(), port)
	}
	eventually(t, 5*time.Second, "the ordinary messages queued", func() bool { return b.depth(q) == 15 })

	fits := testMessage(topic, 100)
	fits.Headers = map[string]string{"Big": strings.Repeat("x", 128<<10-512)}
	if err := s.Send(ctx, fits); err != nil {
		t.Fatalf("headers that fit a frame: %v", err)
	}
	eventually(t, 5*time.Second, "the message with large headers queued", func() bool { return b.depth(q) == 16 })
}

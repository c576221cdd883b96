package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
)

// TestHangingTopicLeavesSendSlots: a topic whose downstream hangs holds at most
// worker.max_sends_per_topic of the worker's sends (2 here); its other messages wait for
// a slot without sending and without using attempts, and a healthy topic's messages are
// delivered meanwhile, each within seconds of its commit.
func TestHangingTopicLeavesSendSlots(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	closing := make(chan struct{})
	hanging := make(chan string, 64)
	e.recv.Handle("/hang", func(w http.ResponseWriter, r *http.Request) {
		hanging <- r.Header.Get("Idempotency-Key")
		select { // answers only when the test ends: each send runs to its timeout
		case <-closing:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(closing) })
	e.cfg.Worker.MaxSendsPerTopic = 2
	e.cfg.Topics["order.hangs"] = config.Topic{Sink: "http", URL: e.recv.URL + "/hang", Timeout: config.Duration(20 * time.Second)}
	e.startWorker(t)
	e.startRelay(t)

	var stuck []uuid.UUID
	for range 6 {
		stuck = append(stuck, e.enqueueOrderPlain(t, "order.hangs", nil))
	}
	// Two sends reach the hanging downstream; the others are not made.
	for range 2 {
		select {
		case <-hanging:
		case <-time.After(30 * time.Second):
			t.Fatal("the hanging topic's sends did not start")
		}
	}
	for i := range 5 {
		committed := time.Now()
		id := e.enqueueOrderPlain(t, "order.created", nil)
		e.waitStatus(t, id, store.StatusSent)
		require.Less(t, time.Since(committed), 5*time.Second, "healthy message %d waited for a slot", i)
	}
	select {
	case key := <-hanging:
		t.Fatalf("a third send of the hanging topic ran at once (message %s)", key)
	default:
	}
	for _, id := range stuck {
		row, err := e.store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusDispatched, row.Status)
		require.Zero(t, row.RetryTimes, "no attempt is used up: the two running have not failed yet, the others sent nothing")
	}
}

package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
)

// TestTopicBacklogDoesNotDelayOtherTopics: 60 messages of one topic are committed at once
// while its downstream hangs; under the relay's default limit of messages in flight per
// topic, 20 of them are handed to Temporal and the other 40 wait in the table, and a
// message of another topic committed after them is delivered at once. When the downstream
// answers again, every message of the backlog is delivered.
func TestTopicBacklogDoesNotDelayOtherTopics(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)

	var (
		mu      sync.Mutex
		reached = map[string]int{} // message ID → the sends that reached the hung downstream
	)
	release := make(chan struct{})
	e.handlers = map[string]delivery.Handler{"bulk.import": delivery.HandlerFunc(func(ctx context.Context, m delivery.Message) error {
		mu.Lock()
		reached[m.MessageID]++
		mu.Unlock()
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})}
	e.startWorker(t)
	e.startRelay(t)

	backlog := enqueueMany(t, e, "bulk.import", 60) // one transaction
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reached) >= starter.DefaultMaxInFlightPerTopic
	}, 30*time.Second, 20*time.Millisecond, "the first messages of the backlog reach the downstream")

	other := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatusWithin(t, other, store.StatusSent, 15*time.Second)

	counts := map[store.Status]int{}
	for _, id := range backlog {
		counts[e.status(t, id)]++
	}
	require.Equal(t, map[store.Status]int{store.StatusDispatched: 20, store.StatusPending: 40}, counts,
		"the limit's messages handed over, the rest waiting in the table")
	mu.Lock()
	require.Len(t, reached, starter.DefaultMaxInFlightPerTopic, "no message beyond the limit reached the downstream")
	mu.Unlock()

	close(release)
	e.waitAllSent(t, backlog, 90*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, reached, len(backlog))
}

package cli_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// TestShowSaysWhyAMessageWaits: outbox show names what a pending message the claim has
// parked waits for (an earlier message of its ordering key, or room under its topic's
// limit of messages in flight), and says nothing more of one that merely waits its turn.
func TestShowSaysWhyAMessageWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, env, st, _ := dlqSetup(t)
	enqueue := func(topic, key string) uuid.UUID {
		t.Helper()
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, OrderingKey: key, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return id
	}
	show := func(id uuid.UUID) (text string, view map[string]any) {
		t.Helper()
		r := run(t, env, "", "show", id.String(), "--config", cfg)
		require.NoError(t, r.err)
		j := run(t, env, "", "show", id.String(), "--config", cfg, "--json")
		require.NoError(t, j.err)
		require.NoError(t, json.Unmarshal([]byte(j.stdout), &view))
		return r.stdout, view
	}

	first, second := enqueue("order.paid", "order-42"), enqueue("order.paid", "order-42")
	bulk := []uuid.UUID{enqueue("bulk", ""), enqueue("bulk", ""), enqueue("bulk", "")}
	res, err := st.ClaimBatch(ctx, 100, time.Minute, store.OrderingRules{TopicMaxInFlight: map[string]int{"bulk": 2}})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 3, "the first of the key and two of bulk")
	waiting := enqueue("other", "")

	text, view := show(second)
	require.Contains(t, text, "\nStatus       pending, held back: waits for an earlier message of ordering key order-42\n")
	require.Equal(t, true, view["held_back"])

	text, view = show(bulk[2])
	require.Contains(t, text, "\nStatus       pending, waiting for room: its topic is at its limit of messages in flight (max_in_flight)")
	require.Equal(t, true, view["held_back"])

	for _, id := range []uuid.UUID{first, bulk[0], waiting} {
		text, view = show(id)
		require.Regexp(t, `\nStatus       (claimed|pending)\n`, text, "a message that is not held back")
		require.NotContains(t, view, "held_back")
	}
}

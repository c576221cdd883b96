package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func TestDLQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, schema, env := setup(t)
	require.NoError(t, run(t, env, "", "migrate", "--config", cfg).err)
	st, err := store.New(testdb.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	dead := func(topic string) uuid.UUID {
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 9}`)})
		require.NoError(t, err)
		_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: topic, WorkflowID: "outbox-" + id.String(), RunID: "run-1", Attempts: 1, LastError: "permanent failure: HTTP 400: bad order"})
		require.NoError(t, err)
		return id
	}
	a, b, c := dead("order.created"), dead("order.paid"), dead("order.created")

	r := run(t, env, "", "dlq", "list", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "MESSAGE ID")
	for _, id := range []uuid.UUID{a, b, c} {
		require.Contains(t, r.stdout, id.String())
	}
	require.Contains(t, r.stdout, "HTTP 400: bad order")

	r = run(t, env, "", "dlq", "list", "--config", cfg, "--topic", "order.paid", "--json")
	require.NoError(t, r.err)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, b.String(), listed[0]["message_id"])

	r = run(t, env, "", "dlq", "list", "--config", cfg, "--since", "yesterday")
	require.ErrorContains(t, r.err, `--since must be a duration such as 1h or a time such as 2026-11-30T09:00:00Z, got "yesterday"`)

	r = run(t, env, "", "dlq", "show", a.String(), "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, `"order_id": 9`)
	require.Contains(t, r.stdout, "after 1 attempts")
	require.Contains(t, r.stdout, "http://127.0.0.1:8233/namespaces/default/workflows/outbox-"+a.String()+"/run-1/history")

	r = run(t, env, "", "dlq", "redrive", a.String(), "--config", cfg, "--by", "alice")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "redriven "+a.String()+" (order.created, redrive 1)")
	row, err := st.Get(ctx, a)
	require.NoError(t, err)
	require.Equal(t, store.StatusPending, row.Status)

	r = run(t, env, "", "dlq", "redrive", a.String(), "--config", cfg)
	require.ErrorContains(t, r.err, "1 of 1 messages not redriven")
	require.Contains(t, r.stderr, "is pending, not dead")

	r = run(t, env, "", "dlq", "redrive", "--config", cfg)
	require.ErrorContains(t, r.err, "--all-matching")

	r = run(t, env, "n\n", "dlq", "discard", b.String(), "--config", cfg)
	require.ErrorContains(t, r.err, "not confirmed")
	r = run(t, env, "y\n", "dlq", "discard", b.String(), "--config", cfg, "--by", "carol")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "discarded "+b.String())

	r = run(t, env, "", "dlq", "redrive", "--all-matching", "--topic", "order.created", "--config", cfg, "--by", "bob")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "redriven "+c.String())
	require.NotContains(t, r.stdout, a.String(), "already redriven")

	r = run(t, env, "", "dlq", "show", a.String(), "--config", cfg, "--json")
	require.NoError(t, r.err)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Equal(t, "pending", shown["status"])
	require.Len(t, shown["audit"], 1)

	r = run(t, env, "", "stats", "--config", cfg, "--json")
	require.NoError(t, r.err)
	var s struct {
		ByStatus        map[string]int64 `json:"by_status"`
		OpenDeadLetters int64            `json:"open_dead_letters"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
	require.Equal(t, int64(2), s.ByStatus["pending"])
	require.Equal(t, int64(1), s.ByStatus["discarded"])
	require.Equal(t, int64(0), s.OpenDeadLetters)

	r = run(t, env, "", "stats", "--config", cfg)
	require.NoError(t, r.err)
	require.True(t, strings.Contains(r.stdout, "order.created") && strings.Contains(r.stdout, "Oldest pending"), r.stdout)
}

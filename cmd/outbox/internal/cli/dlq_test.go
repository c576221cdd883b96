package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// dlqSetup migrates a fresh schema with outbox migrate and returns its config, the
// environment, its store and a function that writes a dead message of topic whose last
// of attempts attempts failed with lastError.
func dlqSetup(t *testing.T) (cfg string, env map[string]string, st *store.Store, dead func(topic string, attempts int, lastError string) uuid.UUID) {
	t.Helper()
	cfg, schema, env := setup(t)
	require.NoError(t, run(t, env, "", "migrate", "--config", cfg).err)
	st, err := store.New(testdb.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	return cfg, env, st, func(topic string, attempts int, lastError string) uuid.UUID {
		ctx := context.Background()
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 9}`)})
		require.NoError(t, err)
		_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: topic, WorkflowID: "outbox-" + id.String(), RunID: "run-1", Attempts: attempts, LastError: lastError})
		require.NoError(t, err)
		return id
	}
}

func TestDLQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, env, st, deadLetter := dlqSetup(t)
	dead := func(topic string) uuid.UUID { return deadLetter(topic, 1, "permanent failure: HTTP 400: bad order") }
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

	// --limit cuts the list, and says so.
	r = run(t, env, "", "dlq", "list", "--config", cfg, "--limit", "2")
	require.NoError(t, r.err)
	require.Equal(t, 2, strings.Count(r.stdout, "order."), r.stdout)
	require.Contains(t, r.stderr, "more dead letters match than --limit 2 lets through")
	r = run(t, env, "", "dlq", "list", "--config", cfg, "--limit", "3")
	require.NoError(t, r.err)
	require.NotContains(t, r.stderr, "--limit")

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

	// A dry run of named messages counts those with an open dead letter, and names the
	// others.
	unknown := uuid.New()
	r = run(t, env, "", "dlq", "redrive", a.String(), c.String(), unknown.String(), "--dry-run", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "would redrive 1 dead-lettered message(s) (order.created: 1)")
	require.Contains(t, r.stdout, c.String())
	require.Contains(t, r.stderr, "would not redrive "+a.String()+": it has no open dead letter")
	require.Contains(t, r.stderr, "would not redrive "+unknown.String()+": it has no open dead letter")

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

// answerAfter is a terminal at which someone answers a prompt after another operator has
// acted: the first Read runs act, then answers.
type answerAfter struct {
	act    func()
	answer string
	done   bool
}

func (r *answerAfter) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	r.done = true
	r.act()
	return copy(p, r.answer), nil
}

// A bulk action acts on the dead letters its filter selected: a message redriven and
// dead-lettered again (for another reason) while the command waited for its confirmation is
// left alone, and the command says so.
// TestShowAKeyWithoutItsPlace shows a row given an ordering key by an UPDATE, after the
// insert that numbers keyed rows: it has a key and no place in it.
func TestShowAKeyWithoutItsPlace(t *testing.T) {
	t.Parallel()
	cfg, env, st, deadLetter := dlqSetup(t)
	keyed := deadLetter("order.created", 1, "HTTP 400")
	_, err := st.DB().Exec(context.Background(), `UPDATE `+st.Schema()+`.outbox_messages SET ordering_key = 'order-9' WHERE message_id = $1`, keyed)
	require.NoError(t, err)
	for _, args := range [][]string{{"dlq", "show"}, {"show"}} {
		r := run(t, env, "", append(args, keyed.String(), "--config", cfg)...)
		require.NoError(t, r.err, args)
		require.Contains(t, r.stdout, "Ordering key order-9\n", args)
	}
}

func TestDLQBulkLeavesALetterWrittenSinceTheSelection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, env, st, deadLetter := dlqSetup(t)
	id := deadLetter("order.created", 12, "gave up after 12 attempts: HTTP 503: maintenance")
	other := deadLetter("order.created", 12, "gave up after 12 attempts: HTTP 503: maintenance")
	bob := &answerAfter{answer: "y\n", act: func() {
		_, err := st.Redrive(ctx, id, "bob")
		require.NoError(t, err)
		_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "outbox-" + id.String(),
			RunID: "run-2", Attempts: 1, LastError: "permanent failure: HTTP 422: unknown SKU"})
		require.NoError(t, err)
	}}
	r := runReading(t, env, bob, "dlq", "discard", "--config", cfg, "--all-matching", "--error", "http 503", "--by", "alice")
	require.ErrorContains(t, r.err, "1 of 2 messages not discarded")
	require.Contains(t, r.stderr, id.String()+": its dead letter changed since the selection (now \"permanent failure: HTTP 422: unknown SKU\"")
	require.Contains(t, r.stdout, "discarded "+other.String())
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusDead, row.Status, "the new dead letter is open")
}

// TestDLQBulk selects dead letters by topic, time and error text, prints a dry run's count
// and sample without changing anything, asks before acting on more than --confirm-over of
// them, and says when --limit cut the selection.
func TestDLQBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, env, st, deadLetter := dlqSetup(t)
	dead := func(topic, lastError string) uuid.UUID { return deadLetter(topic, 12, lastError) }
	outage := []uuid.UUID{
		dead("order.created", "gave up after 12 attempts: HTTP 503: maintenance"),
		dead("order.paid", "gave up after 12 attempts: HTTP 503: maintenance"),
		dead("order.created", "gave up after 12 attempts: http 503: Maintenance"),
	}
	poison := dead("order.created", "permanent failure: HTTP 422: SKU POISON")
	status := func(id uuid.UUID) store.Status {
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		return row.Status
	}

	r := run(t, env, "", "dlq", "redrive", "--config", cfg, "--all-matching", "--error", "http 503", "--since", "1h", "--until", "2026-01-01T00:00:00Z")
	require.ErrorContains(t, r.err, "--since (")
	require.ErrorContains(t, r.err, ") must be before --until (2026-01-01T00:00:00Z)")
	r = run(t, env, "", "dlq", "list", "--config", cfg, "--until", "tomorrow")
	require.ErrorContains(t, r.err, `--until must be a duration such as 1h or a time such as 2026-11-30T09:00:00Z, got "tomorrow"`)
	r = run(t, env, "", "dlq", "redrive", poison.String(), "--config", cfg, "--error", "POISON")
	require.ErrorContains(t, r.err, "give message IDs or a filter")

	r = run(t, env, "", "dlq", "list", "--config", cfg, "--error", "sku poison")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, poison.String())
	require.Equal(t, 2, strings.Count(r.stdout, "\n"), "the header and the poison message: %s", r.stdout)
	r = run(t, env, "", "dlq", "list", "--config", cfg, "--until", "1h")
	require.NoError(t, r.err)
	require.Equal(t, "no dead letters\n", r.stdout)

	// A dry run counts and shows; nothing changes and nothing is asked.
	r = run(t, env, "", "dlq", "redrive", "--config", cfg, "--all-matching", "--error", "HTTP 503", "--since", "1h", "--dry-run")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "would redrive 3 dead-lettered message(s) (order.created: 2, order.paid: 1)\nthe newest 3:\nMESSAGE ID")
	for _, id := range outage {
		require.Contains(t, r.stdout, id.String())
		require.Equal(t, store.StatusDead, status(id))
	}
	require.NotContains(t, r.stdout, poison.String())
	r = run(t, env, "", "dlq", "discard", "--config", cfg, "--all-matching", "--topic", "order.created", "--dry-run")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "would discard 3 dead-lettered message(s) (order.created: 3)")
	require.NotContains(t, r.stdout, "[y/N]")

	// More than --confirm-over asks; no answer redrives nothing.
	r = run(t, env, "n\n", "dlq", "redrive", "--config", cfg, "--all-matching", "--error", "HTTP 503", "--confirm-over", "2", "--by", "alice")
	require.ErrorContains(t, r.err, "not redriven: not confirmed (answer y, or pass --yes)")
	require.Contains(t, r.stdout, "Redrive 3 dead-lettered message(s)? [y/N] ")
	for _, id := range outage {
		require.Equal(t, store.StatusDead, status(id))
	}

	// --limit cuts the selection to the newest, and says so.
	r = run(t, env, "", "dlq", "redrive", "--config", cfg, "--all-matching", "--error", "HTTP 503", "--limit", "1", "--by", "alice")
	require.NoError(t, r.err)
	require.Contains(t, r.stderr, "more dead letters match than --limit 1 lets through: the 1 newest are selected")
	require.Equal(t, "redriven "+outage[2].String()+" (order.created, redrive 1)\n", r.stdout)

	// At or below --confirm-over it acts at once, each message audited.
	r = run(t, env, "", "dlq", "redrive", "--config", cfg, "--all-matching", "--error", "HTTP 503", "--by", "alice")
	require.NoError(t, r.err)
	for _, id := range outage {
		require.Equal(t, store.StatusPending, status(id))
		audit, err := st.Audit(ctx, id)
		require.NoError(t, err)
		require.Len(t, audit, 1)
		require.Equal(t, "alice", audit[0].Actor)
	}
	r = run(t, env, "y\n", "dlq", "discard", "--config", cfg, "--all-matching", "--error", "poison", "--by", "bob")
	require.NoError(t, r.err)
	require.Equal(t, "Discard 1 dead-lettered message(s)? They will not be delivered. [y/N] discarded "+poison.String()+"\n", r.stdout)
	require.Equal(t, store.StatusDiscarded, status(poison))
}

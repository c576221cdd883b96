package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// TestTopicPause: outbox topic pause, list and resume, as an operator runs them: the
// pause is recorded with who and why, shows in list, stats and show, a second pause keeps
// the first, resume ends it, and a bad topic is refused with what is allowed.
func TestTopicPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, env, st, _ := dlqSetup(t)
	// The config knows order.created; order.paid is not in it.
	raw, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, append(raw, []byte("topics:\n  order.created:\n    sink: http\n    url: http://127.0.0.1:9/events\n")...), 0o600))
	id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)

	r := run(t, env, "", "topic", "pause", "order.created", "--config", cfg, "--reason", "billing API maintenance", "--by", "alice")
	require.NoError(t, r.err)
	require.Equal(t, "paused order.created: billing API maintenance\n"+
		"Its messages wait: the relays hand none to Temporal, and a delivery already started waits without using attempts.\n"+
		"outbox topic resume order.created ends the pause.\n", r.stdout)
	require.Empty(t, r.stderr)

	r = run(t, env, "", "topic", "pause", "order.created", "--config", cfg, "--reason", "another", "--by", "bob")
	require.NoError(t, r.err)
	require.Regexp(t, `^order\.created was paused already, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d by alice: billing API maintenance\n$`, r.stdout)

	r = run(t, env, "", "topic", "pause", "order.paid", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stderr, `warning: topic "order.paid" is not under topics: in the config`)

	r = run(t, env, "", "topic", "list", "--config", cfg)
	require.NoError(t, r.err)
	require.Regexp(t, `^TOPIC\s+STATE\s+WAITING\s+OLDEST\s+PAUSED SINCE\s+BY\s+REASON\n`+
		`order\.created\s+paused\s+1\s+none\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+alice\s+billing API maintenance\n`+
		`order\.paid\s+paused \(not in config\)\s+0\s+none\s+\S+ \S+\s+\S+\s+-\n$`, r.stdout)
	r = run(t, env, "", "topic", "list", "--config", cfg, "--json")
	require.NoError(t, r.err)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
	require.Len(t, listed, 2)
	require.Equal(t, map[string]any{"topic": "order.created", "configured": true, "paused": true, "paused_at": listed[0]["paused_at"],
		"paused_by": "alice", "reason": "billing API maintenance", "waiting": 1.0, "oldest_waiting_age_seconds": 0.0}, listed[0])

	r = run(t, env, "", "stats", "--config", cfg)
	require.NoError(t, r.err)
	require.Regexp(t, `\nPaused topics    order\.created since \S+ \S+ by alice: billing API maintenance\n\s+order\.paid since`, r.stdout)
	r = run(t, env, "", "show", id.String(), "--config", cfg, "--json")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, `"topic_paused": true`)

	r = run(t, env, "", "topic", "resume", "order.created", "--config", cfg)
	require.NoError(t, r.err)
	require.Regexp(t, `^resumed order\.created, paused since \S+ \S+ by alice: billing API maintenance\n`, r.stdout)
	r = run(t, env, "", "topic", "resume", "order.created", "--config", cfg)
	require.NoError(t, r.err)
	require.Equal(t, "order.created is not paused: nothing to resume\n", r.stdout)
	paused, err := st.PausedTopics(ctx)
	require.NoError(t, err)
	require.Len(t, paused, 1)
	require.Equal(t, "order.paid", paused[0].Topic)

	r = run(t, env, "", "topic", "pause", "order created", "--config", cfg)
	require.ErrorContains(t, r.err, `topic must match ^[A-Za-z0-9._-]{1,200}$, got "order created"`)
}

package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestStatsNamesThePoliciesInEffect: outbox stats says whose delivery policies the relays
// follow, and whether the file it was given agrees with them.
func TestStatsNamesThePoliciesInEffect(t *testing.T) {
	t.Parallel()
	cfg, env, st, _ := dlqSetup(t)
	r := run(t, env, "", "stats", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "\nPolicies         none published: each relay freezes its own configuration's policies\n")

	published := workflows.Policies{
		Default: workflows.Policy{}.WithDefaults(),
		Topics:  map[string]workflows.Policy{"order.created": workflows.Policy{MaxAttempts: 4}.WithDefaults()},
	}
	doc, err := json.Marshal(published)
	require.NoError(t, err)
	changed := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	_, err = st.PublishPolicy(context.Background(), store.PublishedPolicy{Policies: doc, AsOf: changed, By: "worker 7@host-b, /etc/outbox/worker.yaml"})
	require.NoError(t, err)

	r = run(t, env, "", "stats", "--config", cfg)
	require.NoError(t, r.err)
	require.Regexp(t, `\nPolicies         from worker 7@host-b, /etc/outbox/worker\.yaml, changed \S+ \S+; `+cfg+` differs for order\.created\n`, r.stdout)

	yaml, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, append(yaml, "topics:\n  order.created: {url: 'http://receiver/events', max_attempts: 4}\n"...), 0o600))
	r = run(t, env, "", "stats", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "; "+cfg+" agrees\n")

	r = run(t, env, "", "stats", "--config", cfg, "--json")
	require.NoError(t, r.err)
	var s struct {
		Policies struct {
			By       string             `json:"by"`
			AsOf     time.Time          `json:"as_of"`
			Policies workflows.Policies `json:"policies"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
	require.Equal(t, "worker 7@host-b, /etc/outbox/worker.yaml", s.Policies.By)
	require.True(t, changed.Equal(s.Policies.AsOf))
	require.Equal(t, 4, s.Policies.Policies.For("order.created").MaxAttempts)
}

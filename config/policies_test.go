package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLoadDatesThePolicies: Load records the file and its modification time as the time
// of its delivery policies, and the time of loading when the environment changes a
// topic's policy; the environment changing anything else keeps the file's time. A config
// without a file, or built in Go, has none.
func TestLoadDatesThePolicies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(path, []byte("topics:\n  orders:\n    url: https://example.com/hook\n    max_attempts: 4\n"), 0o600))
	changed := time.Date(2026, 11, 30, 8, 15, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(path, changed, changed))
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}

	c, err := LoadEnv(path, env(map[string]string{"OUTBOX_RELAY_POLL_INTERVAL": "2s"}))
	require.NoError(t, err)
	require.True(t, changed.Equal(c.PolicyAsOf), "as of %s", c.PolicyAsOf)
	require.Equal(t, path, c.Path)
	require.Equal(t, 4, c.Policies().For("orders").MaxAttempts)
	require.Equal(t, 12, c.Policies().For("other").MaxAttempts, "a topic without an entry has the built-in policy")

	before := time.Now()
	c, err = LoadEnv(path, env(map[string]string{"OUTBOX_TOPICS": `{"orders": {"url": "https://example.com/hook", "max_attempts": 6}}`}))
	require.NoError(t, err)
	require.False(t, c.PolicyAsOf.Before(before), "the environment changed a policy: as of loading, got %s", c.PolicyAsOf)
	require.Equal(t, 6, c.Policies().For("orders").MaxAttempts)

	c, err = LoadEnv("", env(nil))
	require.NoError(t, err)
	require.True(t, c.PolicyAsOf.IsZero())
	require.Empty(t, c.Path)
}

// TestPolicies: every listed topic's policy, and the default entry's for the others.
func TestPolicies(t *testing.T) {
	c := &Config{
		Topics:  map[string]Topic{"orders": {URL: "https://example.com", MaxAttempts: 3}},
		Default: &Topic{URL: "https://example.com", MaxAttempts: 5, FirstAttempt: "activity"},
	}
	p := c.Policies()
	require.NoError(t, p.Validate())
	require.Equal(t, c.Policy("orders"), p.For("orders"))
	require.Equal(t, c.Policy("anything"), p.For("anything"))
	require.Equal(t, 5, p.For("anything").MaxAttempts)
	require.Equal(t, "activity", p.Default.FirstAttempt)

	other := *c
	other.Topics = map[string]Topic{"orders": {URL: "https://example.com", MaxAttempts: 4}, "refunds": {URL: "https://example.com"}}
	require.Equal(t, []string{"orders", "refunds"}, p.Differ(other.Policies()))
	other.Default = nil
	require.Equal(t, []string{"orders", "refunds", "(default)"}, p.Differ(other.Policies()))
	require.Empty(t, p.Differ(c.Policies()))
}

package cli_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/app"
)

// TestConfigCheck: outbox config check validates a file, and reports a relay's and a
// worker's files that would deliver a topic differently, exiting as a config error.
func TestConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, yaml string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(yaml), 0o600))
		return p
	}
	relay := write("relay.yaml", "topics:\n  order.created: {url: 'http://receiver/events', max_attempts: 5}\n")
	worker := write("worker.yaml", "topics:\n  order.created: {url: 'http://receiver/events'}\n")
	bad := write("bad.yaml", "topics:\n  order.created: {url: 'http://receiver/events', backoff: 0.5}\n")

	r := run(t, nil, "", "config", "check", "--config", relay)
	require.NoError(t, r.err)
	require.Equal(t, relay+": ok\n", r.stdout)

	r = run(t, nil, "", "config", "check", relay, relay)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "the files agree")

	changed := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(worker, changed, changed))
	require.NoError(t, os.Chtimes(relay, changed.Add(-time.Hour), changed.Add(-time.Hour)))
	r = run(t, nil, "", "config", "check", relay, worker)
	require.True(t, app.IsConfigError(r.err), "%v", r.err)
	require.ErrorContains(t, r.err, relay+" and "+worker+`: topic order.created: policy differs: {"max_attempts":5`)
	require.ErrorContains(t, r.err, "every relay follows the policies of "+worker+", changed last (2026-12-01T09:30:00Z)")

	r = run(t, nil, "", "config", "check", bad)
	require.True(t, app.IsConfigError(r.err), "%v", r.err)
	require.ErrorContains(t, r.err, `topics["order.created"].backoff: must be at least 1, got 0.5`)
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/workflows"
)

// TestTemporalProfile runs outbox relay with a config that names no Temporal server: the
// address and the namespace come from the Temporal CLI's temporal.toml, the profile named
// by TEMPORAL_PROFILE in the file TEMPORAL_CONFIG_FILE names. A message enqueued gets its
// workflow started in that namespace.
func TestTemporalProfile(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	_, st := testdb.Schema(t)
	recv := newReceiver(t)
	dir := t.TempDir()

	cfgPath := filepath.Join(dir, "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %s
temporal:
  task_queue: profile-%s
relay:
  poll_interval: 200ms
topics:
  order.created:
    url: %s/events
`, st.Schema(), st.Schema(), recv.URL)), 0o600))
	tomlPath := filepath.Join(dir, "temporal.toml")
	require.NoError(t, os.WriteFile(tomlPath, []byte(fmt.Sprintf(`
[profile.default]
address = "127.0.0.1:1"

[profile.outbox-test]
address = %q
namespace = %q
`, ts.GetFrontendHostPort(), ts.GetDefaultNamespace())), 0o600))
	env := map[string]string{"DATABASE_URL": testdb.URL(), "TEMPORAL_CONFIG_FILE": tomlPath, "TEMPORAL_PROFILE": "outbox-test"}
	relay := startOutbox(t, "", env, "relay", "--config", cfgPath)
	relayOut := relay.out
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		code, exited := relay.interrupt(30 * time.Second)
		if !exited {
			t.Errorf("relay did not stop within 30s")
			return
		}
		require.Equal(t, 0, code, relayOut.String()) // 0: ok
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool { return strings.Contains(relayOut.String(), "Relay started") },
		30*time.Second, 50*time.Millisecond, "relay:\n%s", relayOut)

	out, code := runOutbox(t, time.Minute, `{"order_id": 7}`, env, "enqueue", "order.created", "--config", cfgPath)
	require.Equal(t, 0, code, out) // 0: ok
	id := uuid.MustParse(strings.TrimSpace(out))

	require.Eventually(t, func() bool {
		qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer qcancel()
		desc, err := ts.GetDefaultClient().DescribeWorkflowExecution(qctx, workflows.WorkflowIDPrefix+id.String(), "")
		return err == nil && desc.GetWorkflowExecutionInfo().GetTaskQueue() == "profile-"+st.Schema()
	}, 30*time.Second, 100*time.Millisecond, "the workflow of %s was not started in namespace %s; relay:\n%s", id, ts.GetDefaultNamespace(), relayOut)
	stop()
	require.Contains(t, relayOut.String(), "Relay stopped")

	// A profile named that the file does not have stops the command before it connects,
	// as a config error.
	env["TEMPORAL_PROFILE"] = "outbox-missing"
	out, code = runOutbox(t, time.Minute, "", env, "relay", "--config", cfgPath)
	require.NotEqual(t, 0, code, out)
	require.Equal(t, 78, code, out) // 78: config
	require.Contains(t, out, `temporal profile "outbox-missing" (TEMPORAL_PROFILE) of `+tomlPath)
}

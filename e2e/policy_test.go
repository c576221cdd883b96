package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestPolicyChangeReachesNewRuns runs a relay and a worker as separate processes do, each
// from a file of its own, and changes a topic's policy the way an operator rolls it out:
// in one file, then the other. The change reaches new runs whichever process reads it
// first: the worker restarted with the changed file while the relay runs on (within
// app.PolicyRefresh), or the relay restarted with it. A relay restarted with its older
// file follows the newer policy instead of bringing its own back.
func TestPolicyChangeReachesNewRuns(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	dir := t.TempDir()
	start := time.Now().Add(-2 * time.Hour)
	write := func(name string, maxAttempts int, changed time.Time) string {
		path := filepath.Join(dir, name)
		yaml := fmt.Sprintf("topics:\n  order.created:\n    sink: http\n    url: %s/events\n    max_attempts: %d\n", e.recv.URL, maxAttempts)
		require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
		require.NoError(t, os.Chtimes(path, changed, changed))
		return path
	}
	// run loads path as outbox relay and outbox worker do and runs fn on the App until
	// the returned stop is called (or the test ends).
	run := func(path string, fn func(*app.App, context.Context) error) (stop func()) {
		cfg, err := config.LoadEnv(path, func(string) (string, bool) { return "", false })
		require.NoError(t, err)
		cfg.DatabaseURL, cfg.Schema = testdb.URL(), e.store.Schema()
		cfg.Temporal = config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue}
		a, err := app.Connect(ctx, cfg, app.Options{Logger: logger})
		require.NoError(t, err)
		t.Cleanup(a.Close) // after stop: cleanups run last in, first out
		return e.run(t, func(ctx context.Context) error { return fn(a, ctx) })
	}
	relay := func(path string) func() {
		return run(path, func(a *app.App, ctx context.Context) error { return a.RunRelay(ctx) })
	}
	worker := func(path string) func() {
		return run(path, func(a *app.App, ctx context.Context) error { return a.RunWorker(ctx, app.Handlers{}) })
	}
	// attempts enqueues a message and returns the max_attempts its run was started with,
	// once it is sent.
	attempts := func() int {
		t.Helper()
		id := e.enqueueOrderPlain(t, "order.created", nil)
		e.waitStatus(t, id, store.StatusSent)
		return startPolicy(t, e, id).MaxAttempts
	}

	relayFile := write("relay.yaml", 3, start)
	workerFile := write("worker.yaml", 3, start)
	stopWorker := worker(workerFile)
	stopRelay := relay(relayFile)
	require.Equal(t, 3, attempts(), "both files say 3")

	// The worker reads the change first; the relay runs on with its file.
	write("worker.yaml", 7, start.Add(time.Hour))
	stopWorker()
	worker(workerFile)
	deadline := time.Now().Add(3 * app.PolicyRefresh)
	for attempts() != 7 {
		require.True(t, time.Now().Before(deadline), "the relay did not follow the worker's newer file within %s", 3*app.PolicyRefresh)
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, 7, attempts(), "every later run follows it")

	// The relay restarted with its older file follows the newer policy from its first run.
	stopRelay()
	stopRelay = relay(relayFile)
	require.Equal(t, 7, attempts(), "a relay restarted with an older file keeps the newer policy")

	// The relay reads a change first; the worker runs on with its file.
	write("relay.yaml", 9, start.Add(90*time.Minute))
	stopRelay()
	relay(relayFile)
	require.Equal(t, 9, attempts(), "the relay's newer file is in effect from its first run")

	published, err := e.store.PublishedPolicy(ctx)
	require.NoError(t, err)
	require.Contains(t, published.By, relayFile)
	require.True(t, published.AsOf.Equal(start.Add(90*time.Minute).Truncate(time.Microsecond)), "as of %s", published.AsOf)
}

// startPolicy returns the policy message id's run was started with.
func startPolicy(t *testing.T, e *env, id uuid.UUID) workflows.Policy {
	t.Helper()
	var in workflows.DeliveryInput
	iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	ev, err := iter.Next()
	require.NoError(t, err)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(ev.GetWorkflowExecutionStartedEventAttributes().GetInput(), &in))
	return in.Policy
}

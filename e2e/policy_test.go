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
	"go.temporal.io/server/temporaltest"

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
	r := newPolicyRig(t)

	relayFile := r.write("relay.yaml", 3, r.start)
	workerFile := r.write("worker.yaml", 3, r.start)
	stopWorker := r.worker(workerFile)
	stopRelay := r.relay(relayFile)
	require.Equal(t, 3, r.attempts(), "both files say 3")

	// The worker reads the change first; the relay runs on with its file.
	r.write("worker.yaml", 7, r.start.Add(time.Hour))
	stopWorker()
	r.worker(workerFile)
	deadline := time.Now().Add(3 * app.PolicyRefresh)
	for r.attempts() != 7 {
		require.True(t, time.Now().Before(deadline), "the relay did not follow the worker's newer file within %s", 3*app.PolicyRefresh)
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, 7, r.attempts(), "every later run follows it")

	// The relay restarted with its older file follows the newer policy from its first run.
	stopRelay()
	stopRelay = r.relay(relayFile)
	require.Equal(t, 7, r.attempts(), "a relay restarted with an older file keeps the newer policy")

	// The relay reads a change first; the worker runs on with its file.
	r.write("relay.yaml", 9, r.start.Add(90*time.Minute))
	stopRelay()
	r.relay(relayFile)
	require.Equal(t, 9, r.attempts(), "the relay's newer file is in effect from its first run")

	published, err := r.e.store.PublishedPolicy(context.Background())
	require.NoError(t, err)
	require.Contains(t, published.By, relayFile)
	require.True(t, published.AsOf.Equal(r.start.Add(90*time.Minute).Truncate(time.Microsecond)), "as of %s", published.AsOf)
}

// policyRig runs relays and workers as separate processes do, each an App from a config
// file of its own, on one isolated outbox.
type policyRig struct {
	t     *testing.T
	ts    *temporaltest.TestServer
	e     *env
	dir   string
	start time.Time // a time before the test, for the files' modification times
}

func newPolicyRig(t *testing.T) *policyRig {
	ts := newServer(t)
	return &policyRig{t: t, ts: ts, e: newEnv(t, ts), dir: t.TempDir(), start: time.Now().Add(-2 * time.Hour)}
}

// write writes the config file name, whose topic order.created has maxAttempts, changed
// at changed, and returns its path.
func (r *policyRig) write(name string, maxAttempts int, changed time.Time) string {
	path := filepath.Join(r.dir, name)
	yaml := fmt.Sprintf("topics:\n  order.created:\n    sink: http\n    url: %s/events\n    max_attempts: %d\n", r.e.recv.URL, maxAttempts)
	require.NoError(r.t, os.WriteFile(path, []byte(yaml), 0o600))
	require.NoError(r.t, os.Chtimes(path, changed, changed))
	return path
}

// run loads path as outbox relay and outbox worker do and runs fn on the App until the
// returned stop is called (or the test ends).
func (r *policyRig) run(path string, fn func(*app.App, context.Context) error) (stop func()) {
	cfg, err := config.LoadEnv(path, func(string) (string, bool) { return "", false })
	require.NoError(r.t, err)
	cfg.DatabaseURL, cfg.Schema = testdb.URL(), r.e.store.Schema()
	cfg.Temporal = config.Temporal{Address: r.ts.GetFrontendHostPort(), Namespace: r.e.namespace, TaskQueue: r.e.taskQueue}
	a, err := app.Connect(context.Background(), cfg, app.Options{Logger: logger})
	require.NoError(r.t, err)
	r.t.Cleanup(a.Close) // after stop: cleanups run last in, first out
	return r.e.run(r.t, func(ctx context.Context) error { return fn(a, ctx) })
}

func (r *policyRig) relay(path string) func() {
	return r.run(path, func(a *app.App, ctx context.Context) error { return a.RunRelay(ctx) })
}

func (r *policyRig) worker(path string) func() {
	return r.run(path, func(a *app.App, ctx context.Context) error { return a.RunWorker(ctx, app.Handlers{}) })
}

// attempts enqueues a message and returns the max_attempts its run was started with, once
// it is sent.
func (r *policyRig) attempts() int {
	r.t.Helper()
	id := r.e.enqueueOrderPlain(r.t, "order.created", nil)
	r.e.waitStatus(r.t, id, store.StatusSent)
	return startPolicy(r.t, r.e, id).MaxAttempts
}

// TestPolicyOnASchemaBeforeMigration14: on a schema without the published policy's
// columns, a relay and a worker still start and deliver, and the relay freezes its own
// file's policy into the runs it starts.
func TestPolicyOnASchemaBeforeMigration14(t *testing.T) {
	t.Parallel()
	r := newPolicyRig(t)
	_, err := r.e.pool.Exec(context.Background(), `ALTER TABLE `+r.e.store.Schema()+`.outbox_deployment
		DROP COLUMN policy, DROP COLUMN policy_as_of, DROP COLUMN policy_by, DROP COLUMN policy_published_at`)
	require.NoError(t, err)
	r.worker(r.write("worker.yaml", 7, r.start.Add(time.Hour)))
	r.relay(r.write("relay.yaml", 5, r.start))
	require.Equal(t, 5, r.attempts(), "the relay's own file")
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

package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/deployment"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestEmbeddedWorker runs the outbox the way examples/handler does: app.Connect from a
// config, PrepareWorker with a topic handled by Go code, and the team's own SDK worker. A
// message of the Go topic and one of the config's http topic are both delivered, and the
// worker serves /metrics as outbox worker does; its identity tells the relays which
// workflow version it runs.
func TestEmbeddedWorker(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)
	// A namespace that does not exist is a config error, with the search attribute check
	// (which finds it) or without.
	for _, check := range []bool{true, false} {
		_, err := app.Connect(ctx, &config.Config{
			DatabaseURL:      testdb.URL(),
			Schema:           e.store.Schema(),
			Temporal:         config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: "no-such-namespace", TaskQueue: e.taskQueue},
			SearchAttributes: &check,
		}, app.Options{Logger: logger})
		require.True(t, app.IsConfigError(err), "search attributes checked: %v: %v", check, err)
		require.ErrorContains(t, err, `namespace "no-such-namespace" not found`)
	}

	a, err := app.Connect(ctx, &config.Config{
		DatabaseURL: testdb.URL(),
		Schema:      e.store.Schema(),
		Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
		Metrics:     config.Metrics{Address: "127.0.0.1:0"},
		Topics:      e.cfg.Topics,
	}, app.Options{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(a.Close)

	var points atomic.Int32
	deps, err := a.PrepareWorker(ctx, app.Handlers{Topics: map[string]delivery.Handler{
		"loyalty.points": delivery.HandlerFunc(func(context.Context, delivery.Message) error {
			points.Add(1)
			return nil
		}),
	}})
	require.NoError(t, err)
	w := sdkworker.New(a.Temporal, a.Config.Temporal.TaskQueue, worker.Options(a.Config.Worker.WorkerOptions(), deps))
	worker.Register(w, deps)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	// The relays see its workflow version, as they see outbox worker's.
	require.Eventually(t, func() bool {
		v, _, err := deployment.DeliveryVersion(ctx, a.Temporal, e.taskQueue, deps.Deployment, workflows.DeliveryVersion+1)
		return err == nil && v == workflows.DeliveryVersion
	}, 30*time.Second, 100*time.Millisecond, "the relay reads the team worker's version")
	e.startRelay(t)

	byCode := e.enqueueOrderPlain(t, "loyalty.points", nil)
	byConfig := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatus(t, byCode, store.StatusSent)
	e.waitStatus(t, byConfig, store.StatusSent)
	require.Equal(t, int32(1), points.Load())
	requests, _ := e.recv.Count(byConfig.String())
	require.Equal(t, 1, requests)

	addr, err := a.ServeMetrics()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m := testutil.Scrape(t, "http://"+addr.String()+"/metrics")
		return m[`outbox_messages_sent_total{topic="loyalty.points"}`] == 1
	}, 30*time.Second, 100*time.Millisecond)
}

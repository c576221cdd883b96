package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestDeliveredNotRecorded: the worker loses its database right after the downstream got
// the message, so mark-sent fails past its bound; the run completes "delivered, not
// recorded", and the relay's reconciliation records the row from it, with no second send.
func TestDeliveredNotRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)

	// The worker reaches PostgreSQL through the proxy; the relay directly.
	workerStore, proxy := proxiedStore(t, e)

	var mu sync.Mutex
	requests := 0
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		proxy.down() // the downstream has the message; now the worker's database is gone
	}))
	t.Cleanup(recv.Close)
	reg, err := (&config.Config{Topics: map[string]config.Topic{"order.created": {URL: recv.URL}}}).Registry(nil)
	require.NoError(t, err)
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue, Deps: worker.Deps{Store: workerStore, Handlers: reg, Logger: logger}})
	})
	r, err := starter.New(e.store, e.pool, e.client, starter.Config{
		TaskQueue: e.taskQueue, PollInterval: 200 * time.Millisecond, Lease: 5 * time.Second, Logger: logger,
		Policy: func(string) workflows.Policy { return workflows.Policy{MarkSentTimeout: 2 * time.Second} },
	})
	require.NoError(t, err)
	e.run(t, r.Run)
	counters := prometheus.NewRegistry()
	m, err := metrics.New(counters)
	require.NoError(t, err)
	rc, err := starter.NewReconciler(e.store, e.client, starter.ReconcilerConfig{After: time.Second, Interval: 200 * time.Millisecond, Logger: logger, Metrics: m})
	require.NoError(t, err)
	e.run(t, rc.Run)

	id := e.enqueueOrderPlain(t, "order.created", nil)
	require.Eventually(t, func() bool { return e.status(t, id) == store.StatusDispatched || e.status(t, id) == store.StatusSent }, 30*time.Second, 20*time.Millisecond)
	var res workflows.DeliveryResult
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, e.client.GetWorkflow(waitCtx, workflows.WorkflowID(id.String()), "").Get(waitCtx, &res))
	require.True(t, res.Unrecorded, "the run completed delivered, not recorded")

	e.waitStatus(t, id, store.StatusSent)
	audit, err := e.store.Audit(ctx, id)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Contains(t, *audit[0].Detail, "recorded_sent")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, requests, "reconciliation records the row; it does not send again")
	// No worker counted the message sent (its mark-sent failed); reconciliation did, once.
	require.Equal(t, 1, promtest.CollectAndCount(counters, "outbox_messages_sent_total"))
	families, err := counters.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "outbox_messages_sent_total" {
			require.Equal(t, 1.0, f.GetMetric()[0].GetCounter().GetValue())
		}
	}
}

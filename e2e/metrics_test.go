package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store"
)

// TestMetrics runs the worker and the relay of one App (one registry, one endpoint, as in
// outbox dev) through a known scenario: three messages delivered, one dead-lettered by a
// 400. It reads /metrics, /healthz and /readyz over HTTP.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)
	e.recv.SetStatus("order.failing", http.StatusBadRequest)

	a, err := app.Open(ctx, &config.Config{
		DatabaseURL: testdb.URL(),
		Schema:      e.store.Schema(),
		Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
		Relay:       config.Relay{PollInterval: config.Duration(200 * time.Millisecond)},
		Metrics:     config.Metrics{Address: "127.0.0.1:0"},
		Topics:      e.cfg.Topics,
	}, app.Options{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(a.Close) // after the worker and the relay stop
	require.NoError(t, a.DialTemporal(ctx))
	addr, err := a.ServeMetrics()
	require.NoError(t, err)
	base := "http://" + addr.String()
	e.run(t, func(ctx context.Context) error { return a.RunWorker(ctx, app.Handlers{}) })
	e.run(t, a.RunRelay)

	var delivered []uuid.UUID
	for range 3 {
		delivered = append(delivered, e.enqueueOrderPlain(t, "order.created", nil))
	}
	dead := e.enqueueOrderPlain(t, "order.failing", nil)
	for _, id := range delivered {
		e.waitStatus(t, id, store.StatusSent)
	}
	e.waitStatus(t, dead, store.StatusDead)

	// The counters follow the row updates by a moment, and the workflows complete after
	// the rows are recorded sent.
	var m map[string]float64
	require.Eventually(t, func() bool {
		m = testutil.Scrape(t, base+"/metrics")
		return m[`outbox_messages_sent_total{topic="order.created"}`] == 3 &&
			m[`outbox_messages_dead_lettered_total{topic="order.failing"}`] == 1 &&
			completedDeliveries(m) == 3
	}, 30*time.Second, 100*time.Millisecond, "sent and dead-lettered counts, completed workflows")

	for series, want := range map[string]float64{
		`outbox_messages_claimed_total`:                                         4,
		`outbox_workflows_started_total`:                                        4,
		`outbox_workflows_already_started_total`:                                0,
		`outbox_send_attempts_total{topic="order.created"}`:                     3,
		`outbox_send_attempts_total{topic="order.failing"}`:                     1,
		`outbox_send_failures_total{kind="permanent",topic="order.failing"}`:    1,
		`outbox_commit_to_sent_seconds_count{topic="order.created"}`:            3,
		`outbox_commit_to_sent_seconds_bucket{topic="order.created",le="+Inf"}`: 3,
		`outbox_relay_batch_size_sum`:                                           4,
		`outbox_messages_pending{topic="order.created"}`:                        0,
		`outbox_oldest_pending_age_seconds{topic="order.failing"}`:              0,
		`outbox_errors_total{operation="claim"}`:                                0,
		`outbox_errors_total{operation="start_workflow"}`:                       0,
		`outbox_errors_total{operation="mark_sent"}`:                            0,
		`outbox_errors_total{operation="dead_letter"}`:                          0,
		`outbox_backlog_query_failures_total`:                                   0,
		`outbox_send_duration_seconds_count{topic="order.created"}`:             3,
		`outbox_send_duration_seconds_count{topic="order.failing"}`:             1,
		`outbox_ready`: 1, // as /readyz: the database, Temporal and the search attributes answer
	} {
		got, ok := m[series]
		require.True(t, ok, "series %s is missing", series)
		require.Equal(t, want, got, "series %s", series)
	}
	require.NotContains(t, m, `outbox_messages_sent_total{topic="order.failing"}`)
	batches := m[`outbox_relay_batch_size_count`]
	require.GreaterOrEqual(t, batches, 1.0)
	require.LessOrEqual(t, batches, 4.0)
	require.Equal(t, batches, m[`outbox_relay_batch_duration_seconds_count`])
	require.Greater(t, m[`outbox_commit_to_sent_seconds_sum{topic="order.created"}`], 0.0)

	// The Temporal SDK's own metrics share the endpoint.
	var temporalSeries int
	for series := range m {
		if strings.HasPrefix(series, "temporal_") {
			temporalSeries++
		}
	}
	require.Positive(t, temporalSeries, "no temporal_* series")

	code, body := testutil.HTTPGet(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = testutil.HTTPGet(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok\n", body)

	t.Run("NotReadyWithoutTheDatabase", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
		require.NoError(t, err)
		st, err := store.New(pool, store.Config{Schema: e.store.Schema()})
		require.NoError(t, err)
		cfg := a.Config
		cfg.Metrics.Address = "127.0.0.1:0"
		down := &app.App{Config: cfg, Logger: logger, Pool: pool, Store: st,
			Temporal: ts.NewClientWithOptions(client.Options{Namespace: e.namespace})}
		t.Cleanup(down.Close)
		addr, err := down.ServeMetrics()
		require.NoError(t, err)
		code, body := testutil.HTTPGet(t, "http://"+addr.String()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.True(t, strings.HasPrefix(body, "database: "), body)
		code, _ = testutil.HTTPGet(t, "http://"+addr.String()+"/healthz")
		require.Equal(t, http.StatusOK, code)
	})
}

// completedDeliveries sums the SDK's temporal_workflow_completed_total over OutboxDelivery
// workflows (a dead-lettered message's workflow fails, so it is not among them).
func completedDeliveries(m map[string]float64) float64 {
	var completed float64
	for series, v := range m {
		if strings.HasPrefix(series, "temporal_workflow_completed_total{") && strings.Contains(series, `workflow_type="OutboxDelivery"`) {
			completed += v
		}
	}
	return completed
}

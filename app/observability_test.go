package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	open := func(t *testing.T, address string) *app.App {
		t.Helper()
		_, st := testdb.Schema(t)
		a, err := app.Open(ctx, &config.Config{DatabaseURL: testdb.URL(), Schema: st.Schema(), Metrics: config.Metrics{Address: address},
			Topics: map[string]config.Topic{"order.created": {URL: "http://127.0.0.1:1/events"}}}, app.Options{Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(a.Close)
		return a
	}

	t.Run("OffWithoutAddress", func(t *testing.T) {
		t.Parallel()
		a := open(t, "")
		addr, err := a.ServeMetrics()
		require.NoError(t, err)
		require.Nil(t, addr)
		require.Nil(t, a.Metrics())
	})

	t.Run("ServesMetricsHealthAndReadiness", func(t *testing.T) {
		t.Parallel()
		a := open(t, "127.0.0.1:0")
		addr, err := a.ServeMetrics()
		require.NoError(t, err)
		again, err := a.ServeMetrics()
		require.NoError(t, err)
		require.Equal(t, addr, again, "one endpoint per App")
		require.NotNil(t, a.Metrics())
		base := "http://" + addr.String()

		code, body := testutil.HTTPGet(t, base+"/healthz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok\n", body)

		code, body = testutil.HTTPGet(t, base+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "temporal: not connected\n", body)

		a.Metrics().Redriven("order.created")
		a.Metrics().Redriven("order.unconfigured")
		code, body = testutil.HTTPGet(t, base+"/metrics")
		require.Equal(t, http.StatusOK, code)
		for _, line := range []string{
			`outbox_messages_pending{topic="order.created"} 0`, // every topic of the config
			`outbox_oldest_pending_age_seconds{topic="order.created"} 0`,
			`outbox_errors_total{operation="claim"} 0`,
			`outbox_messages_redriven_total{topic="order.created"} 1`, // a topic of the config
			`outbox_messages_redriven_total{topic="(other)"} 1`,
			"outbox_backlog_query_failures_total 0",
			"outbox_ready 0", // as /readyz: Temporal is not connected
		} {
			require.Contains(t, strings.Split(body, "\n"), line)
		}
		require.Contains(t, body, "go_goroutines ")
		require.Contains(t, body, "process_cpu_seconds_total ")
	})

	t.Run("NotReadyWhenTheDatabaseIsUnreachable", func(t *testing.T) {
		t.Parallel()
		up := open(t, "")
		pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		st, err := store.New(pool, store.Config{})
		require.NoError(t, err)
		cfg := up.Config
		cfg.Metrics.Address = "127.0.0.1:0"
		down := &app.App{Config: cfg, Logger: quiet, Pool: pool, Store: st}
		t.Cleanup(down.Close)
		addr, err := down.ServeMetrics()
		require.NoError(t, err)

		code, body := testutil.HTTPGet(t, "http://"+addr.String()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.True(t, strings.HasPrefix(body, "database: "), body)
		code, _ = testutil.HTTPGet(t, "http://"+addr.String()+"/healthz")
		require.Equal(t, http.StatusOK, code)
		code, body = testutil.HTTPGet(t, "http://"+addr.String()+"/metrics")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "outbox_backlog_query_failures_total 1")
		require.NotContains(t, body, "outbox_messages_pending{")
		require.Contains(t, strings.Split(body, "\n"), "outbox_ready 0")
	})

	t.Run("AddressInUseIsAnError", func(t *testing.T) {
		t.Parallel()
		first := open(t, "127.0.0.1:0")
		addr, err := first.ServeMetrics()
		require.NoError(t, err)
		second := open(t, addr.String())
		_, err = second.ServeMetrics()
		require.ErrorContains(t, err, "metrics.address")
	})
}

func TestTracingEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "shop"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
	} {
		got := app.TracingEnabled(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
		require.Equal(t, tc.want, got, "%v", tc.env)
	}
}

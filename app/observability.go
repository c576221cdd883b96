package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"

	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/metrics"
)

// telemetry is what an App owns for metrics, health and tracing: one registry and one
// HTTP endpoint per process, shared by the worker and the relay when both run in it.
type telemetry struct {
	mu            sync.Mutex
	initErr       error
	initialised   bool
	registry      *prometheus.Registry
	metrics       *metrics.Metrics
	meterProvider *sdkmetric.MeterProvider
	sdkMetrics    client.MetricsHandler
	server        *http.Server
	addr          net.Addr
	shutdowns     []func(context.Context) error // tracing
}

// backlogTimeout bounds the backlog query of one scrape.
const backlogTimeout = 2 * time.Second

func (a *App) log() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

// initMetrics builds the registry, the outbox's metrics and the Temporal SDK's metrics
// handler, once, when metrics.address is set.
func (a *App) initMetrics() error {
	t := &a.tel
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.initialised || a.Config.Metrics.Address == "" {
		return t.initErr
	}
	t.initialised = true
	t.initErr = func() error {
		reg := prometheus.NewRegistry()
		if err := reg.Register(collectors.NewGoCollector()); err != nil {
			return err
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return err
		}
		m, err := metrics.New(reg)
		if err != nil {
			return err
		}
		m.KnownTopics(slices.Collect(maps.Keys(a.Config.Topics))...)
		if err := reg.Register(metrics.NewBacklogCollector(a.driver(), backlogTimeout).LabelTopics(m)); err != nil {
			return err
		}
		if err := reg.Register(metrics.NewReadyGauge(a.Ready)); err != nil {
			return err
		}
		// The Temporal SDK reports through OpenTelemetry; its exporter writes into the same
		// registry, so one /metrics serves both (series named temporal_*).
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
		if err != nil {
			return err
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		log := a.log()
		t.sdkMetrics = temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
			Meter:                mp.Meter("temporal-sdk-go"),
			UseMonotonicCounters: true,
			OnError: func(err error) {
				log.Warn("Temporal SDK metric not recorded", slog.Any("error", err))
			},
		})
		t.registry, t.metrics, t.meterProvider = reg, m, mp
		return nil
	}()
	if t.initErr != nil {
		t.initErr = fmt.Errorf("metrics: %w", t.initErr)
	}
	return t.initErr
}

// Metrics returns the process's outbox metrics, or nil when metrics.address is empty. The
// worker and the relay record into it; other code (a redrive, for one) may too.
func (a *App) Metrics() *metrics.Metrics {
	if err := a.initMetrics(); err != nil {
		a.log().Warn("Metrics are off", slog.Any("error", err))
		return nil
	}
	return a.tel.metrics
}

// sdkMetricsHandler returns the Temporal client's metrics handler, nil when metrics are
// off.
func (a *App) sdkMetricsHandler() (client.MetricsHandler, error) {
	if err := a.initMetrics(); err != nil {
		return nil, err
	}
	return a.tel.sdkMetrics, nil
}

// ServeMetrics starts the HTTP endpoint on metrics.address, once per App, and returns the
// address it listens on; it returns nil, nil when metrics.address is empty. The endpoint
// serves:
//
//	/metrics  the outbox's and the Temporal SDK's metrics, in Prometheus text format
//	/healthz  200 while the process runs
//	/readyz   200 when PostgreSQL answers a ping, Temporal answers a health check and
//	          (unless search_attributes is false) the search attributes exist; else 503
//	          with the reason
//
// It stops when the App is closed.
func (a *App) ServeMetrics() (net.Addr, error) {
	if a.Config.Metrics.Address == "" {
		return nil, nil
	}
	if err := a.initMetrics(); err != nil {
		return nil, err
	}
	t := &a.tel
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.server != nil {
		return t.addr, nil
	}
	ln, err := net.Listen("tcp", a.Config.Metrics.Address)
	if err != nil {
		return nil, fmt.Errorf("metrics.address: serve /metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(t.registry,
		promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{Registry: t.registry, ErrorHandling: promhttp.ContinueOnError})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.Ready(r.Context()); err != nil {
			plain(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		plain(w, http.StatusOK, "ok")
	})
	t.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	t.addr = ln.Addr()
	srv, log := t.server, a.log()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("Metrics endpoint stopped", slog.Any("error", err))
		}
	}()
	log.Info("Serving /metrics, /healthz and /readyz", slog.String("address", t.addr.String()))
	return t.addr, nil
}

// readyTimeout bounds the checks of one /readyz request.
const readyTimeout = 3 * time.Second

// Ready returns nil when the process can do its work: the database answers a ping, Temporal
// answers a health check, the search attributes exist unless they are turned off, and
// Temporal does not refuse every workflow start of the relay.
// Otherwise it returns the first reason it is not.
func (a *App) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := a.database().Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if a.Temporal == nil {
		return errors.New("temporal: not connected")
	}
	if _, err := a.Temporal.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return fmt.Errorf("temporal: %w", err)
	}
	if a.Config.SearchAttributesEnabled() {
		if err := temporalx.CheckSearchAttributes(ctx, a.Temporal, a.Config.Temporal.Namespace); err != nil {
			return fmt.Errorf("temporal: %w", err)
		}
	}
	if r := a.relay.Load(); r != nil {
		if err := r.StartsRefused(); err != nil {
			return fmt.Errorf("relay: %w", err)
		}
	}
	a.handlersMu.Lock()
	regs := slices.Clone(a.handlers)
	a.handlersMu.Unlock()
	for _, reg := range regs {
		notReady := reg.NotReady()
		for _, name := range slices.Sorted(maps.Keys(notReady)) {
			return fmt.Errorf("sink of %s not connected: %w", name, notReady[name])
		}
	}
	return nil
}

// plain writes a one-line text answer.
func plain(w http.ResponseWriter, code int, msg string) {
	msg = strings.ReplaceAll(msg, "\n", " ")
	if len(msg) > 500 {
		msg = msg[:500] + "..."
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// closeTelemetry stops the endpoint and flushes the meter and tracer providers.
func (a *App) closeTelemetry() {
	t := &a.tel
	t.mu.Lock()
	defer t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if t.server != nil {
		if err := t.server.Shutdown(ctx); err != nil {
			_ = t.server.Close()
		}
		t.server = nil
	}
	if t.meterProvider != nil {
		_ = t.meterProvider.Shutdown(ctx)
		t.meterProvider = nil
	}
	for _, shutdown := range t.shutdowns {
		if err := shutdown(ctx); err != nil {
			a.log().Warn("Cannot flush traces", slog.Any("error", err))
		}
	}
	t.shutdowns = nil
}

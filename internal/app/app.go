// Package app wires the outbox's parts together from a config: the database pool, the
// store, the Temporal client, the worker and the relay. cmd/outbox is a thin layer of
// flags over it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
)

// App holds the connections one outbox process uses.
type App struct {
	Config   config.Config // with defaults
	Logger   *slog.Logger
	Pool     *pgxpool.Pool
	Store    *store.Store
	Temporal client.Client // nil until DialTemporal

	tel   telemetry                     // metrics registry, /metrics endpoint, tracing
	relay atomic.Pointer[starter.Relay] // the running relay, for readiness
}

// Open validates cfg (after defaults), connects to PostgreSQL and checks that it answers.
func Open(ctx context.Context, cfg *config.Config, logger *slog.Logger, sinks ...string) (*App, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(sinks...); err != nil {
		return nil, fmt.Errorf("invalid config:\n%w", err)
	}
	poolCfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx leaves the password out of its parse errors.
		return nil, fmt.Errorf("database_url: %w", err)
	}
	if !strings.Contains(c.DatabaseURL, "pool_max_conns") {
		// pgxpool's default (4 on a small machine) is too few for a worker running many
		// activities beside a relay starting workflows concurrently.
		poolCfg.MaxConns = 20
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d database %s as %s: %w",
			poolCfg.ConnConfig.Host, poolCfg.ConnConfig.Port, poolCfg.ConnConfig.Database, poolCfg.ConnConfig.User, err)
	}
	st, err := store.New(pool, store.Config{Schema: c.Schema, MaxPayloadBytes: c.MaxPayloadBytes})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &App{Config: c, Logger: logger, Pool: pool, Store: st}, nil
}

// DialTemporal connects to Temporal and, unless search attributes are off, makes sure
// they exist.
func (a *App) DialTemporal(ctx context.Context) error {
	sdkMetrics, err := a.sdkMetricsHandler()
	if err != nil {
		return err
	}
	opts, err := TemporalOptions(a.Config)
	if err != nil {
		return err
	}
	opts.Logger, opts.MetricsHandler = a.Logger, sdkMetrics
	c, err := temporalx.Dial(ctx, opts)
	if err != nil {
		return err
	}
	if a.Config.SearchAttributesEnabled() {
		saCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := temporalx.EnsureSearchAttributes(saCtx, c, a.Config.Temporal.Namespace); err != nil {
			c.Close()
			return err
		}
	}
	a.Temporal = c
	return nil
}

// TemporalOptions returns where Temporal is and how to reach it securely, from cfg: TLS,
// the API key and the payload codec.
func TemporalOptions(cfg config.Config) (temporalx.Options, error) {
	t := cfg.Temporal
	tlsCfg, err := t.TLSConfig()
	if err != nil {
		return temporalx.Options{}, fmt.Errorf("invalid config:\n%w", err)
	}
	cdc, err := cfg.Codec.New()
	if err != nil {
		return temporalx.Options{}, fmt.Errorf("invalid config:\n%w", err)
	}
	o := temporalx.Options{
		Address: t.Address, Namespace: t.Namespace,
		TLS: tlsCfg, TLSDisabled: t.TLS.Disabled(), APIKey: t.APIKey,
	}
	if cdc != nil {
		o.Codec = cdc
	}
	return o, nil
}

// Close closes the connections.
func (a *App) Close() {
	a.closeTelemetry()
	if a.Temporal != nil {
		a.Temporal.Close()
	}
	a.Pool.Close()
}

// RunWorker runs the worker until ctx is cancelled. sinks adds sink kinds besides http.
func (a *App) RunWorker(ctx context.Context, sinks map[string]activities.SinkFactory) error {
	if a.Temporal == nil {
		return errors.New("run worker: not connected to Temporal")
	}
	reg, err := activities.RegistryFromConfig(&a.Config, sinks)
	if err != nil {
		return fmt.Errorf("build topic handlers: %w", err)
	}
	if _, err := a.ServeMetrics(); err != nil {
		return err
	}
	if a.Config.Retention.Enabled {
		if err := a.EnsureRetentionSchedule(ctx); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
	}
	return worker.Run(ctx, worker.Config{
		Client:    a.Temporal,
		TaskQueue: a.Config.Temporal.TaskQueue,
		Deps:      worker.Deps{Store: a.Store, Handlers: reg, Logger: a.Logger, Alerts: activities.AlertWebhooksFromConfig(&a.Config), Metrics: a.Metrics()},
		Options:   a.Config.Worker.WorkerOptions(),
	})
}

// RunRelay runs the relay until ctx is cancelled.
func (a *App) RunRelay(ctx context.Context) error { return a.RunRelayWith(ctx, nil) }

// RunRelayWith is RunRelay with the relay's configuration adjusted by adjust.
func (a *App) RunRelayWith(ctx context.Context, adjust func(*starter.Config)) error {
	if a.Temporal == nil {
		return errors.New("run relay: not connected to Temporal")
	}
	if _, err := a.ServeMetrics(); err != nil {
		return err
	}
	cfg := a.RelayConfig()
	if adjust != nil {
		adjust(&cfg)
	}
	r, err := starter.New(a.Store, a.Pool, a.Temporal, cfg)
	if err != nil {
		return err
	}
	a.relay.Store(r)
	defer a.relay.Store(nil)
	return r.Run(ctx)
}

// RelayConfig returns the relay's configuration.
func (a *App) RelayConfig() starter.Config {
	c := a.Config
	return starter.Config{
		TaskQueue:          c.Temporal.TaskQueue,
		BatchSize:          c.Relay.BatchSize,
		Wakeup:             starter.Wakeup(c.Relay.Wakeup),
		PollInterval:       time.Duration(c.Relay.PollInterval),
		Lease:              time.Duration(c.Relay.Lease),
		StartConcurrency:   c.Relay.StartConcurrency,
		NoSearchAttributes: !c.SearchAttributesEnabled(),
		Policy:             c.Policy,
		Ordering:           c.OrderingRules(),
		ReconcileAfter:     time.Duration(c.Relay.ReconcileAfter),
		ReconcileInterval:  time.Duration(c.Relay.ReconcileInterval),
		Logger:             a.Logger,
		Metrics:            a.Metrics(),
	}
}

// Migrate applies the migrations the schema lacks and turns the table's NOTIFY trigger on
// or off for relay.wakeup. It returns the versions it applied.
func (a *App) Migrate(ctx context.Context) ([]int, error) {
	applied, err := a.Store.Migrate(ctx)
	if err != nil {
		return applied, err
	}
	return applied, a.Store.SetNotify(ctx, a.Config.Relay.Wakeup == string(starter.WakeupNotify))
}

// Package app runs the outbox from a config, exactly as outbox worker and outbox relay do,
// in a process of the team's own: the database pool and store, the Temporal client (TLS,
// API key, payload codec, tracing interceptor, the search-attribute check), the worker with
// the config's topic handlers and alert webhooks, the relay, the retention schedule,
// metrics and readiness. cmd/outbox is a thin layer of flags over it.
//
//	a, err := app.Connect(ctx, cfg, app.Options{Logger: logger}) // cfg from config.Load
//	defer a.Close()
//	err = a.RunRelay(ctx)                   // or a.RunWorker, or a.PrepareWorker for a worker of your own
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/storedriver"
	"github.com/outbox-go/outbox/worker"
)

// databaseNames are the names UnavailableError gives the databases besides PostgreSQL.
var databaseNames = map[string]string{config.DatabaseMySQL: "MySQL"}

// App holds the connections one outbox process uses.
type App struct {
	Config config.Config // with defaults
	Logger *slog.Logger
	// Driver is the outbox store of the configured database, whichever it is.
	Driver store.Driver
	// Pool and Store are the PostgreSQL connections and store; nil on another database.
	Pool     *pgxpool.Pool
	Store    *store.Store
	Temporal client.Client // nil until DialTemporal

	db Database // the open database: Driver, and how to ping, enqueue and close

	tel        telemetry                     // metrics registry, /metrics endpoint, tracing
	relay      atomic.Pointer[starter.Relay] // the running relay, for readiness
	handlersMu sync.Mutex
	handlers   []*activities.Registry // built by PrepareWorker, closed by Close
	background []context.CancelFunc   // of the work that goes on until Close (untilClose)
	policiesMu sync.Mutex
	policies   *sharedPolicies // made by the first relay or worker (sharedPolicies)
}

// Options are what Open and Connect take besides the config. The zero value is ready to
// use.
type Options struct {
	// Logger receives the process's logs; nil is slog.Default().
	Logger *slog.Logger
	// Sinks names the sink kinds, besides those the outbox has built in, that the config's
	// topics may use: the kinds the Handlers.Sinks given to PrepareWorker or RunWorker
	// provide. A topic naming any other kind is a config error.
	Sinks []string
	// Databases opens the databases besides PostgreSQL that database_url may name, by
	// their kind (config.DatabaseMySQL): the library links no driver for them, so that a
	// team on PostgreSQL builds no MySQL code. outbox's command passes mysqlstore's.
	Databases map[string]DatabaseOpener
}

// DatabaseOpener connects to the database url names, checks that it answers, and returns
// its outbox store; an error it marks *storedriver.ConfigError becomes a [ConfigError],
// any other an [UnavailableError]. mysqlstore.OpenDatabase is MySQL's.
type DatabaseOpener = storedriver.Opener

// Database is an open outbox database.
type Database = storedriver.Database

// Open validates cfg (after defaults), connects to the database database_url names
// (PostgreSQL, or one of opts.Databases) and checks that it answers. An invalid config is
// a [ConfigError]; the database not answering, an [UnavailableError].
func Open(ctx context.Context, cfg *config.Config, opts Options) (*App, error) {
	c := cfg.WithDefaults()
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if err := c.Validate(opts.Sinks...); err != nil {
		return nil, &ConfigError{fmt.Errorf("invalid config:\n%w", err)}
	}
	kind, err := config.DatabaseKind(c.DatabaseURL)
	if err != nil {
		return nil, &ConfigError{fmt.Errorf("database_url: %w", err)}
	}
	a := &App{Config: c, Logger: logger}
	if kind == config.DatabasePostgres {
		if a.Pool, a.Store, err = openPostgres(ctx, c); err != nil {
			return nil, err
		}
		a.db = postgresDatabase(a.Pool, a.Store)
	} else {
		open := opts.Databases[kind]
		if open == nil {
			return nil, &ConfigError{fmt.Errorf("database_url names a %s database, which this program was built without: "+
				"outbox's own command supports it; a program of your own passes its opener in app.Options.Databases "+
				"(for MySQL: map[string]app.DatabaseOpener{config.DatabaseMySQL: mysqlstore.OpenDatabase})", kind)}
		}
		if a.db, err = open(ctx, c.DatabaseURL, c.MaxPayloadBytes); err != nil {
			var cfgErr *storedriver.ConfigError
			switch {
			case IsConfigError(err), IsUnavailable(err):
				return nil, err
			case errors.As(err, &cfgErr):
				return nil, &ConfigError{err}
			}
			return nil, &UnavailableError{Service: databaseNames[kind], Err: err}
		}
	}
	a.Driver = a.db.Driver
	return a, nil
}

// postgresDatabase is the Database of a PostgreSQL pool and store.
func postgresDatabase(pool *pgxpool.Pool, st *store.Store) Database {
	return Database{
		Driver:  st,
		Enqueue: func(ctx context.Context, msg store.Message) (uuid.UUID, error) { return st.Enqueue(ctx, pool, msg) },
		Ping:    pool.Ping,
		Close:   pool.Close,
	}
}

// database is the open database; for an App made as a struct literal with Pool and Store,
// the PostgreSQL one.
func (a *App) database() Database {
	if a.db.Driver == nil && a.Store != nil && a.Pool != nil {
		return postgresDatabase(a.Pool, a.Store)
	}
	return a.db
}

// driver is the store of the configured database: Driver, or Store for an App made as a
// struct literal.
func (a *App) driver() store.Driver {
	if a.Driver == nil && a.Store != nil {
		return a.Store
	}
	return a.Driver
}

// openPostgres connects to the PostgreSQL database of c and checks that it answers.
func openPostgres(ctx context.Context, c config.Config) (*pgxpool.Pool, *store.Store, error) {
	poolCfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx leaves the password out of its parse errors.
		return nil, nil, &ConfigError{fmt.Errorf("database_url: %w", err)}
	}
	if !strings.Contains(c.DatabaseURL, "pool_max_conns") {
		// pgxpool's default (4 on a small machine) is too few for a worker running many
		// activities beside a relay starting workflows concurrently.
		poolCfg.MaxConns = 20
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, nil, &ConfigError{fmt.Errorf("connect to PostgreSQL: %w", err)}
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		err = fmt.Errorf("connect to PostgreSQL at %s:%d database %s as %s: %w",
			poolCfg.ConnConfig.Host, poolCfg.ConnConfig.Port, poolCfg.ConnConfig.Database, poolCfg.ConnConfig.User, err)
		if rejectedLogin(err) {
			return nil, nil, &ConfigError{err}
		}
		return nil, nil, &UnavailableError{"PostgreSQL", err}
	}
	st, err := store.New(pool, store.Config{Schema: c.Schema, MaxPayloadBytes: c.MaxPayloadBytes})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}

// Connect is Open, then StartTracing (when the OTEL_* environment asks for traces), then
// DialTemporal: everything a worker or a relay needs, in one call.
func Connect(ctx context.Context, cfg *config.Config, opts Options) (*App, error) {
	a, err := Open(ctx, cfg, opts)
	if err != nil {
		return nil, err
	}
	a.StartTracing(ctx)
	if err := a.DialTemporal(ctx); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// DialTemporal connects to Temporal and makes sure the namespace exists and, unless search
// attributes are off, that they do. Stopped (ctx cancelled) meanwhile, it returns an error
// that wraps context.Canceled.
func (a *App) DialTemporal(ctx context.Context) error {
	sdkMetrics, err := a.sdkMetricsHandler()
	if err != nil {
		return err
	}
	opts, err := temporalOptions(a.Config)
	if err != nil {
		return err
	}
	opts.Logger, opts.MetricsHandler = a.Logger, sdkMetrics
	c, err := temporalx.Dial(ctx, opts)
	if err != nil {
		return &UnavailableError{"Temporal", err}
	}
	checkCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if a.Config.SearchAttributesEnabled() {
		err = temporalx.EnsureSearchAttributes(checkCtx, c, a.Config.Temporal.Namespace)
	} else {
		err = temporalx.CheckNamespace(checkCtx, c, a.Config.Temporal.Namespace)
	}
	if err != nil {
		c.Close()
		if temporalx.IsNamespaceNotFound(err) {
			return &ConfigError{err}
		}
		if temporalx.Unanswered(err) {
			return &UnavailableError{"Temporal", err}
		}
		return err
	}
	a.Temporal = c
	return nil
}

// ClientOptions returns the Temporal SDK client options outbox worker and outbox relay dial
// with, from cfg: the address and namespace, TLS, the API key, the gRPC headers and
// authority, the payload codec's data and failure converters, and the OpenTelemetry
// tracing interceptor. A team that dials its own client gets the same connection from
// them.
func ClientOptions(cfg config.Config) (client.Options, error) {
	o, err := temporalOptions(cfg)
	if err != nil {
		return client.Options{}, err
	}
	return temporalx.ClientOptions(o)
}

// Dial connects to Temporal with ClientOptions(cfg) and checks that it answers; a failed
// TLS handshake is explained with the setting to look at.
func Dial(ctx context.Context, cfg config.Config) (client.Client, error) {
	o, err := temporalOptions(cfg)
	if err != nil {
		return nil, err
	}
	return temporalx.Dial(ctx, o)
}

// temporalOptions returns where Temporal is and how to reach it securely, from cfg: TLS,
// the API key, the gRPC headers and authority, and the payload codec.
func temporalOptions(cfg config.Config) (temporalx.Options, error) {
	t := cfg.Temporal
	tlsCfg, err := t.TLSConfig()
	if err != nil {
		return temporalx.Options{}, &ConfigError{fmt.Errorf("invalid config:\n%w", err)}
	}
	cdc, err := cfg.Codec.New()
	if err != nil {
		return temporalx.Options{}, &ConfigError{fmt.Errorf("invalid config:\n%w", err)}
	}
	o := temporalx.Options{
		Address: t.Address, Namespace: t.Namespace,
		TLS: tlsCfg, TLSDisabled: t.TLS.Disabled(), APIKey: t.APIKey,
		Headers: t.Headers(), Authority: t.Authority,
	}
	if cdc != nil {
		o.Codec = cdc
	}
	return o, nil
}

// Close closes the connections, the topic handlers' (a broker sink's) included.
func (a *App) Close() {
	a.handlersMu.Lock()
	regs, background := a.handlers, a.background
	a.handlers, a.background = nil, nil
	a.handlersMu.Unlock()
	for _, stop := range background {
		stop()
	}
	for _, reg := range regs {
		if err := reg.Close(); err != nil {
			a.Logger.Warn("Closing the topic handlers failed", slog.Any("error", err))
		}
	}
	a.closeTelemetry()
	if a.Temporal != nil {
		a.Temporal.Close()
	}
	if db := a.database(); db.Close != nil {
		db.Close()
	}
}

// Handlers is what a process adds to the config's topics: sink kinds besides http (by
// the name a topic's sink: names), and handlers written in Go for topics of their own.
type Handlers struct {
	Sinks  map[string]sinks.Factory
	Topics map[string]delivery.Handler
}

// PrepareWorker does what RunWorker does before the worker runs: it builds the topic
// handlers of the config (with h's) and opens them (a broker sink connects: a setting no
// retry fixes, such as refused credentials or a missing stream, stops the start; a broker
// that cannot be reached now does not, and the sink is reported not ready on /readyz and
// in outbox_sink_ready until it connects; Close closes them), serves /metrics, /healthz
// and /readyz when metrics.address is set, makes sure the retention schedule exists when
// retention is on, and publishes the config's delivery policies for the relays when the
// config has a PolicyAsOf (config.Load sets it; a publication that fails is retried every
// PolicyRefresh until ctx ends or the App is closed). It returns what the outbox's
// workflow and activities need on a worker: worker.Register(w, deps) adds the outbox to a
// worker the team already runs, exactly as outbox worker runs it.
func (a *App) PrepareWorker(ctx context.Context, h Handlers) (worker.Deps, error) {
	if a.Temporal == nil {
		return worker.Deps{}, errors.New("prepare worker: not connected to Temporal")
	}
	// As worker.Run does, for a team's own worker too: the task queue must be this
	// database's, and no other outbox deployment may poll it.
	id, err := worker.CheckTaskQueue(ctx, a.Temporal, a.driver(), a.Config.Temporal.TaskQueue, a.log())
	if err != nil {
		return worker.Deps{}, err
	}
	reg, err := a.Config.Registry(h.Sinks)
	if err != nil {
		return worker.Deps{}, fmt.Errorf("build topic handlers: %w", err)
	}
	for topic, handler := range h.Topics {
		reg.Handle(topic, handler)
	}
	a.handlersMu.Lock()
	a.handlers = append(a.handlers, reg)
	a.handlersMu.Unlock()
	m, log := a.Metrics(), a.log()
	reg.OnOpen = func(name string, err error) {
		m.SinkReady(name, err == nil)
		if err != nil {
			log.Warn("Sink not connected; its messages wait and are retried, and it is connected again in the background",
				slog.String("sink_of", name), slog.Any("error", err))
		} else {
			log.Info("Sink connected", slog.String("sink_of", name))
		}
	}
	openCtx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	if err := reg.Open(openCtx); err != nil {
		return worker.Deps{}, fmt.Errorf("open topic sinks:\n%w", err)
	}
	if _, err := a.ServeMetrics(); err != nil {
		return worker.Deps{}, err
	}
	if a.Config.Retention.Enabled {
		if err := a.EnsureRetentionSchedule(ctx); err != nil {
			return worker.Deps{}, err
		}
	}
	shared, err := a.sharedPolicies("worker")
	if err != nil {
		return worker.Deps{}, err
	}
	if shared != nil {
		// Published for the relays: until ctx ends or the App is closed, if the database
		// does not answer now.
		shared.start(a.untilClose(ctx), false)
	}
	return worker.Deps{Store: a.driver(), Handlers: reg, Logger: a.Logger, Alerts: a.Config.AlertWebhooks(), Metrics: a.Metrics(), Client: a.Temporal, Deployment: id,
		MaxSendsPerTopic: a.Config.Worker.MaxSendsPerTopic}, nil
}

// untilClose returns a context that ends with ctx or when the App is closed, whichever
// comes first: for work in the background that must not outlive the connections.
func (a *App) untilClose(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	a.handlersMu.Lock()
	a.background = append(a.background, cancel)
	a.handlersMu.Unlock()
	return ctx
}

// openTimeout bounds the connecting of the topic sinks when the worker starts.
const openTimeout = 30 * time.Second

// RunWorker runs a worker of its own (the config's task queue and worker options) until
// ctx is cancelled, after PrepareWorker.
func (a *App) RunWorker(ctx context.Context, h Handlers) error {
	deps, err := a.PrepareWorker(ctx, h)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	return a.runWorker(ctx, deps)
}

// Run runs the worker and the relay in this process, until ctx is cancelled or either of
// them fails: the one production process most deployments want. The relay starts each
// workflow eagerly (EagerStart: Temporal hands the run's first workflow task straight to
// this process's worker, one round trip less per message). Several such processes may
// run against one database and namespace, as separate relays and workers may.
//
// They stop in order: the relay first (no new starts; the starts under way end within
// starter.StopGrace), then the worker, which lets the sends in flight finish within
// worker.stop_timeout. Close the App after Run returns: the
// Temporal client outlives both.
func (a *App) Run(ctx context.Context, h Handlers) error {
	// The worker and the relay share one publication of the policies, named for both.
	if _, err := a.sharedPolicies("relay and worker"); err != nil {
		return err
	}
	deps, err := a.PrepareWorker(ctx, h)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	// The worker stops after the relay, not with ctx.
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorker()
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	workerDone, relayDone := make(chan error, 1), make(chan error, 1)
	go func() { workerDone <- a.runWorker(workerCtx, deps) }()
	go func() {
		relayDone <- a.RunRelayWith(relayCtx, func(c *starter.Config) { c.EagerStart = true })
	}()
	select {
	case err = <-relayDone: // stopped with ctx, or failed
		stopWorker()
		if werr := <-workerDone; err == nil {
			err = werr
		}
		if err != nil {
			err = fmt.Errorf("relay: %w", err)
		}
	case err = <-workerDone: // a worker stops only on a fatal error before ctx ends
		stopRelay()
		<-relayDone
		if err != nil {
			err = fmt.Errorf("worker: %w", err)
		}
	}
	return err
}

// runWorker runs a worker of its own with deps until ctx is cancelled.
func (a *App) runWorker(ctx context.Context, deps worker.Deps) error {
	return worker.Run(ctx, worker.Config{
		Client:    a.Temporal,
		TaskQueue: a.Config.Temporal.TaskQueue,
		Deps:      deps,
		Options:   a.Config.Worker.WorkerOptions(),
	})
}

// RunRelay runs the relay, and the reconciler beside it, until ctx is cancelled or the
// relay gives up (see starter.Relay.Run). When the config has a PolicyAsOf (config.Load
// sets it to the file's modification time), the relay publishes the config's delivery
// policies and freezes the newest published ones into the runs it starts, reading them
// back every PolicyRefresh: a policy change reaches new runs whichever relay or worker
// reads the changed file first. Without one it freezes the config's own.
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
	shared, err := a.sharedPolicies("relay")
	if err != nil {
		return err
	}
	if shared != nil {
		cfg.Policy = shared.Policy
	}
	if adjust != nil {
		adjust(&cfg)
	}
	r, err := starter.New(a.driver(), a.Pool, a.Temporal, cfg)
	if err != nil {
		return err
	}
	rcCfg := a.Config.ReconcilerConfig()
	rcCfg.Logger, rcCfg.Metrics = a.Logger, a.Metrics()
	rc, err := starter.NewReconciler(a.driver(), a.Temporal, rcCfg)
	if err != nil {
		return err
	}
	a.relay.Store(r)
	defer a.relay.Store(nil)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if shared != nil {
		shared.start(ctx, true)
	}
	reconciled := make(chan struct{})
	go func() {
		defer close(reconciled)
		_ = rc.Run(ctx)
	}()
	err = r.Run(ctx)
	stop()
	<-reconciled
	return err
}

// RelayConfig returns the relay's configuration: the file's (config.RelayConfig) with the
// App's logger and metrics.
func (a *App) RelayConfig() starter.Config {
	r := a.Config.RelayConfig()
	r.Logger, r.Metrics = a.Logger, a.Metrics()
	return r
}

// Migrate applies the migrations the schema lacks, records the config's task queue on the
// deployment when none is recorded yet, and turns the table's NOTIFY trigger on or off for
// relay.wakeup. It returns the versions it applied.
func (a *App) Migrate(ctx context.Context) ([]int, error) {
	applied, err := a.driver().Migrate(ctx)
	if err != nil {
		return applied, err
	}
	if _, _, err := a.driver().RecordTaskQueue(ctx, a.Config.Temporal.TaskQueue); err != nil {
		return applied, err
	}
	if a.Store == nil {
		// Only PostgreSQL notifies the relays; elsewhere they poll.
		return applied, nil
	}
	return applied, a.Store.SetNotify(ctx, a.Config.Relay.Wakeup == string(starter.WakeupNotify))
}

// MoveTaskQueue records the config's task queue on the deployment, replacing the one
// recorded (see store.Store.MoveTaskQueue).
func (a *App) MoveTaskQueue(ctx context.Context) error {
	return a.driver().MoveTaskQueue(ctx, a.Config.Temporal.TaskQueue)
}

// Enqueue enqueues one message in a transaction of its own, on whichever database the
// config names. Business code enqueues in its own transaction instead, through its
// database's store (store.Store.Enqueue, mysqlstore.Store.Enqueue).
func (a *App) Enqueue(ctx context.Context, msg store.Message) (uuid.UUID, error) {
	return a.database().Enqueue(ctx, msg)
}

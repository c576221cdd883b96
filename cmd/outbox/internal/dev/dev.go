// Package dev is `outbox dev`: the whole system in one process for a developer's machine.
// It starts a private PostgreSQL cluster, or with --database mysql a private MariaDB (or
// MySQL) server (unless DATABASE_URL is set), a Temporal server with its Web UI (unless
// TEMPORAL_ADDRESS is set: the Temporal CLI's development server when a temporal command
// is on PATH, else the outbox's own, built on first use; both in a child process), the
// worker, the relay and the demo services, and on Ctrl-C stops them all, the database and
// Temporal included.
//
// This package does not link the Temporal server (package devserver does, for the
// temporalserver binary), so go run ./cmd/outbox builds only the outbox.
package dev

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/cmd/outbox/internal/demo"
	"github.com/outbox-go/outbox/cmd/outbox/internal/mariadbserver"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/pgcluster"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// markerFile marks a folder as a dev folder, so --reset never wipes anything else.
const markerFile = ".outbox-dev"

// sessionLock is the dev folder's lock, which one outbox dev holds while it runs.
const sessionLock = "lock"

// Options are the flags of outbox dev.
type Options struct {
	Dir       string
	Reset     bool
	Ephemeral bool
	Only      string

	// Database is the database to run on: config.DatabasePostgres or
	// config.DatabaseMySQL; empty follows DATABASE_URL, else PostgreSQL.
	Database  string
	PGBinDir  string
	PGPort    int
	MySQLPort int

	Temporal       TemporalOptions
	TemporalServer string // auto, cli or builtin

	NoDemo        bool
	Broker        string
	NATSURL       string
	OrdersAddr    string
	InventoryAddr string
	FailRate      float64
}

// Command returns the dev subcommand.
func Command(env *cli.Env) *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system locally: PostgreSQL or MariaDB, Temporal with its Web UI, worker, relay and a demo",
		Long: `Runs everything in one process, with no Docker:

  PostgreSQL    DATABASE_URL if set, else a private cluster in --dir made with the local
                PostgreSQL server programs (--pg-bin-dir, OUTBOX_PG_BIN_DIR, PATH, or the
                usual install folders)
  or MariaDB    with --database mysql: DATABASE_URL (a mysql:// URL) if set, else a private
                MariaDB server in --dir (its data in mariadb/, made once with
                mariadb-install-db; on 127.0.0.1, port --mysql-port or the last run's, root
                without a password, database outbox) run with the local server programs
                (mariadbd on PATH or in /usr/sbin, /usr/local/mysql/bin, ...; Oracle
                MySQL's mysqld when MariaDB is not installed). The demo keeps its tables
                there too.
  Temporal      TEMPORAL_ADDRESS if set, else a Temporal server in a child process, its
                state in --dir (--ephemeral: thrown away at exit), frontend on 127.0.0.1:7233
                and the Web UI on http://127.0.0.1:8233: the Temporal CLI's development server
                (temporal server start-dev) when a temporal command is on PATH, else the
                outbox's own, built from this module with the go command on first use (a few
                minutes once; later runs start in seconds). --temporal-server chooses.
  worker, relay the outbox itself
  demo          an order service and an inventory service (see outbox demo --help)

Without --config the demo's topic order.created is routed to the demo inventory service.
Ctrl-C stops everything, the database server included. --only temporal runs just the
Temporal server and UI. --database follows DATABASE_URL when not given; given, it must
name the database DATABASE_URL names.

--temporal-postgres URL keeps the built-in Temporal server's state in PostgreSQL instead
of SQLite, as a production server does (the postgres12 SQL persistence, for default and
visibility stores): postgres://user[:password]@host[:port]/NAME[?sslmode=...] uses databases
NAME and NAME_visibility (NAME defaults to temporal), creates them when missing and sets up
or updates their schemas with the server's own schema tooling at every start; the namespace
is registered and the outbox's search attributes added through the frontend. With --only
temporal it is the production-shaped server a benchmark reaches through TEMPORAL_ADDRESS:
  go run ./cmd/outbox dev --only temporal --ui-port 0 \
    --temporal-postgres 'postgres://postgres@127.0.0.1:5432/outbox_temporal?sslmode=disable'
Drop the two databases to start over.`,
		Example: `  go run ./cmd/outbox dev
  curl -s -X POST http://127.0.0.1:8080/orders -d '{"sku": "SKU-1", "qty": 2}'
  open http://127.0.0.1:8233
  go run ./cmd/outbox dev --database mysql`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("database") {
				o.Database = "" // follow DATABASE_URL
			}
			if o.PGBinDir == "" {
				o.PGBinDir, _ = env.LookupEnv("OUTBOX_PG_BIN_DIR")
			}
			if o.NATSURL == "" {
				o.NATSURL, _ = env.LookupEnv("NATS_URL")
			}
			return Run(cmd.Context(), env, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", ".outbox-dev", "folder for the database's and Temporal's data and logs")
	f.BoolVar(&o.Reset, "reset", false, "wipe --dir first (the PostgreSQL or MariaDB data included)")
	f.BoolVar(&o.Ephemeral, "ephemeral", false, "throw Temporal's state away at exit (it is kept on tmpfs when the machine has one)")
	f.StringVar(&o.Only, "only", "", `run only one part: "temporal" (the server and its UI)`)
	f.StringVar(&o.PGBinDir, "pg-bin-dir", "", "folder with initdb and postgres (default: $OUTBOX_PG_BIN_DIR, PATH, /usr/lib/postgresql/*/bin, ...)")
	f.StringVar(&o.Database, "database", config.DatabasePostgres, `the database to run on: "postgres" or "mysql" (a private MariaDB server, or MySQL's when MariaDB is not installed); default: the one DATABASE_URL names, else postgres`)
	f.IntVar(&o.PGPort, "pg-port", 0, "port of the private PostgreSQL (default: the last one if free, else any free port)")
	f.IntVar(&o.MySQLPort, "mysql-port", 0, "port of the private MariaDB server of --database mysql (default: the last one if free, else any free port)")
	o.Temporal.AddFlags(f)
	f.StringVar(&o.TemporalServer, "temporal-server", ServerAuto, "the Temporal server to run when TEMPORAL_ADDRESS is not set: auto (the Temporal CLI's when a temporal command is on PATH, else the built-in one), cli (temporal server start-dev) or builtin (built from this module on first use)")
	f.BoolVar(&o.NoDemo, "no-demo", false, "do not run the demo services")
	f.StringVar(&o.Broker, "broker", "", `also publish each demo order to a broker: "nats" (JetStream at --nats-url, started from the local nats-server when none answers)`)
	f.StringVar(&o.NATSURL, "nats-url", "", "NATS server of --broker nats (default: $NATS_URL, else nats://127.0.0.1:4222)")
	f.StringVar(&o.OrdersAddr, "orders-addr", "127.0.0.1:8080", "listen address of the demo order service")
	f.StringVar(&o.InventoryAddr, "inventory-addr", "127.0.0.1:8081", "listen address of the demo inventory service")
	f.Float64Var(&o.FailRate, "fail-rate", 0, "share of demo inventory requests answered with 503, 0 to 1")
	return cmd
}

// Run runs the dev system until ctx is cancelled.
func Run(ctx context.Context, env *cli.Env, o Options, out io.Writer) (err error) {
	if o.Only != "" && o.Only != "temporal" {
		return cli.UsageErrorf(`--only must be "temporal", got %q`, o.Only)
	}
	if o.Database != "" && o.Database != config.DatabasePostgres && o.Database != config.DatabaseMySQL {
		return cli.UsageErrorf(`--database must be "postgres" or "mysql", got %q`, o.Database)
	}
	if o.Broker != "" && o.Broker != "nats" {
		return cli.UsageErrorf(`--broker must be "nats", got %q`, o.Broker)
	}
	if !(o.FailRate >= 0 && o.FailRate <= 1) {
		return cli.UsageErrorf("--fail-rate must be between 0 and 1, got %g", o.FailRate)
	}
	if o.Broker != "" && (o.NoDemo || env.ConfigPath() != "") {
		return cli.UsageErrorf("--broker adds the demo's broker topic; with --no-demo or --config, route topics to a broker in the config (sink: nats)")
	}
	o.NATSURL = cmp.Or(o.NATSURL, "nats://127.0.0.1:4222")
	if o.Temporal.PostgresURL != "" && o.Ephemeral {
		return fmt.Errorf("%s and --ephemeral: the state in PostgreSQL is kept; drop its two databases to throw it away", PostgresFlag)
	}
	logger, err := env.Logger()
	if err != nil {
		return err
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if o.Database, err = chooseDatabase(o, cfg.DatabaseURL); err != nil {
		return err
	}
	// Resolve the folder once: every child process and file below uses this path, whatever
	// its working directory.
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	release, err := prepareDir(o.Dir, o.Reset)
	if err != nil {
		return err
	}
	defer release()
	s := &session{o: o, cfg: cfg, logger: logger, givenDatabase: cfg.DatabaseURL != ""}
	defer s.stop()

	if o.Only == "" {
		start := s.startPostgres
		if o.Database == config.DatabaseMySQL {
			start = s.startMySQL
		}
		if err := start(ctx); err != nil {
			return err
		}
	}
	if err := s.startTemporal(ctx); err != nil {
		return err
	}
	if o.Only == "temporal" {
		fmt.Fprintf(out, "outbox dev (temporal only) is ready; Ctrl-C stops it\n%s\n", strings.Join(s.lines, "\n"))
		<-ctx.Done()
		return nil
	}
	if err := s.openOutbox(ctx, env.ConfigPath() == ""); err != nil {
		return err
	}
	if !o.NoDemo {
		if err := s.startDemo(ctx); err != nil {
			return err
		}
	}
	errs := s.runWorkerAndRelay(ctx)
	if err := s.writeEnvFile(); err != nil {
		return err
	}

	fmt.Fprintf(out, "outbox dev is ready; Ctrl-C stops everything\n%s\n", strings.Join(s.lines, "\n"))
	if !o.NoDemo {
		fmt.Fprintf(out, "\nTry:\n  curl -s -X POST http://%s/orders -d '{\"sku\": \"SKU-1\", \"qty\": 2}'\n", loopback(o.OrdersAddr))
	}

	select {
	case <-ctx.Done():
		logger.Info("Shutting down")
		return nil
	case err := <-errs:
		return err
	case <-s.dbExited:
		return fmt.Errorf("%s exited; see its log in %s", s.dbName, s.path(s.dbLog))
	case <-s.temporalExited:
		return errors.New("the Temporal server exited; see its log in " + s.path("temporal.log"))
	}
}

// session is one run of outbox dev: what it started, in order, and the summary it prints.
type session struct {
	o      Options
	cfg    *config.Config
	logger *slog.Logger
	// givenDatabase is set when the environment or the config named the database (outbox
	// dev then starts none).
	givenDatabase bool

	app        *app.App
	teamTopics bool // the demo teams' topics are routed; their workers run
	// dbExited is closed when the database server outbox dev started has ended; dbName
	// and dbLog name it and its log file in the dev folder.
	dbExited      <-chan struct{}
	dbName, dbLog string
	// temporalExited is closed when the Temporal server outbox dev started has ended.
	temporalExited <-chan struct{}
	stops          []func()
	lines          []string
}

// stop stops what the session started, last first.
func (s *session) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// show adds a line to the summary.
func (s *session) show(name, format string, args ...any) {
	s.lines = append(s.lines, fmt.Sprintf("  %-15s %s", name, fmt.Sprintf(format, args...)))
}

// path returns a file of the dev folder as the user should read it: relative to the
// working directory when it is below it, else absolute.
func (s *session) path(name string) string {
	p := filepath.Join(s.o.Dir, name)
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(rel, "..") {
			return rel
		}
	}
	return p
}

// startPostgres starts the private cluster, unless DATABASE_URL names a database.
func (s *session) startPostgres(ctx context.Context) error {
	if s.cfg.DatabaseURL != "" {
		s.show("PostgreSQL", "DATABASE_URL (%s)", RedactURL(s.cfg.DatabaseURL))
		return nil
	}
	binDir, err := pgcluster.FindBinDir(s.o.PGBinDir, exec.LookPath)
	if err != nil {
		return err
	}
	pg, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: binDir, Dir: s.o.Dir, Port: s.o.PGPort, LogPath: filepath.Join(s.o.Dir, "postgres.log"), Logger: s.logger})
	if err != nil {
		return err
	}
	s.stops = append(s.stops, pg.Stop)
	s.dbExited, s.dbName, s.dbLog = pg.Exited(), "PostgreSQL", "postgres.log"
	s.cfg.DatabaseURL = pg.URL()
	dataDir, moved := pg.DataDir()
	if moved == "" {
		dataDir = s.path("postgres")
	}
	s.show("PostgreSQL", "%s  (pid %d, data in %s, log %s)", pg.URL(), pg.PID(), dataDir, s.path("postgres.log"))
	if moved != "" {
		s.show("", "(data kept outside %s: %s)", s.path(""), moved)
	}
	return nil
}

// startMySQL starts the private MariaDB (or MySQL) server, unless DATABASE_URL names a
// database.
func (s *session) startMySQL(ctx context.Context) error {
	if s.cfg.DatabaseURL != "" {
		s.show("MySQL", "DATABASE_URL (%s)", RedactURL(s.cfg.DatabaseURL))
		return nil
	}
	started := time.Now()
	srv, err := mariadbserver.Start(ctx, mariadbserver.Options{Dir: s.o.Dir, Port: s.o.MySQLPort, LogPath: filepath.Join(s.o.Dir, "mariadb.log"), Logger: s.logger})
	if err != nil {
		return fmt.Errorf("--database mysql: %w", err)
	}
	s.stops = append(s.stops, srv.Stop)
	s.dbExited, s.dbName, s.dbLog = srv.Exited(), srv.Product(), "mariadb.log"
	s.cfg.DatabaseURL = srv.URL()
	s.show(srv.Product(), "%s  (pid %d, data in %s, log %s, ready in %s)", srv.URL(), srv.PID(), s.path("mariadb"), s.path("mariadb.log"),
		time.Since(started).Round(100*time.Millisecond))
	return nil
}

// serverName names the private server of each database.
var serverName = map[string]string{config.DatabasePostgres: "PostgreSQL", config.DatabaseMySQL: "MariaDB"}

// chooseDatabase returns the database the session runs on: the one url (DATABASE_URL)
// names when it is set, which --database must then agree with; else --database, else
// PostgreSQL. It refuses the other database's port flag.
func chooseDatabase(o Options, url string) (string, error) {
	kind := cmp.Or(o.Database, config.DatabasePostgres)
	if url != "" {
		named, err := config.DatabaseKind(url)
		if err != nil {
			return "", fmt.Errorf("DATABASE_URL: %w", err)
		}
		if o.Database != "" && o.Database != named {
			return "", fmt.Errorf("--database %s, but DATABASE_URL (or database_url of the config) names a %s database (%s): drop --database, or unset DATABASE_URL to run a private %s server", o.Database, named, RedactURL(url), serverName[o.Database])
		}
		kind = named
	}
	switch {
	case kind == config.DatabasePostgres && o.MySQLPort != 0:
		return "", fmt.Errorf("--mysql-port %d is the port of the private MariaDB server of --database mysql, and this run uses PostgreSQL", o.MySQLPort)
	case kind == config.DatabaseMySQL && o.PGPort != 0:
		return "", fmt.Errorf("--pg-port %d is the port of the private PostgreSQL cluster, and this run uses MySQL (--database mysql)", o.PGPort)
	}
	return kind, nil
}

// startTemporal starts the Temporal server and its UI (the Temporal CLI's or the built-in
// one, see --temporal-server), unless TEMPORAL_ADDRESS names a server (--only temporal
// starts one regardless).
func (s *session) startTemporal(ctx context.Context) error {
	if s.cfg.Temporal.Address != "" && s.o.Only != "temporal" {
		if s.o.Temporal.PostgresURL != "" {
			return fmt.Errorf("%s configures the Temporal server of outbox dev, but the config names another one (%s: TEMPORAL_ADDRESS, temporal.address or a temporal.toml profile); unset it, or use --only temporal", PostgresFlag, s.cfg.Temporal.Address)
		}
		s.show("Temporal", "%s  namespace %s  (TEMPORAL_ADDRESS, temporal.address or a temporal.toml profile)", s.cfg.Temporal.Address, cmp.Or(s.cfg.Temporal.Namespace, "default"))
		return nil
	}
	mode, err := ResolveServer(s.o.TemporalServer, s.o.Temporal, exec.LookPath)
	if err != nil {
		return err
	}
	t := s.o.Temporal
	t.LogFile = filepath.Join(s.o.Dir, "temporal.log")
	if !s.o.Ephemeral && t.PostgresURL == "" {
		// The CLI's server and the built-in one keep different schemas: one file each.
		t.DatabaseFile = filepath.Join(s.o.Dir, map[string]string{ServerCLI: "temporal-cli.db", ServerBuiltin: "temporal.db"}[mode])
	}
	if s.cfg.Temporal.Namespace != "" {
		t.Namespace = s.cfg.Temporal.Namespace
	}
	started := time.Now()
	ts, err := StartServer(ctx, mode, t, s.logger)
	if err != nil {
		return err
	}
	s.stops = append(s.stops, ts.Stop)
	s.temporalExited = ts.Exited()
	s.cfg.Temporal.Address = ts.Address
	s.cfg.Temporal.Namespace = cmp.Or(t.Namespace, "default")
	state := "thrown away at exit"
	switch {
	case t.PostgresURL != "":
		state = "in " + describePostgres(t.PostgresURL)
	case t.DatabaseFile != "":
		state = "in " + s.path(filepath.Base(t.DatabaseFile))
	}
	s.show("Temporal", "%s  namespace %s  (%s, state %s, log %s, ready in %s)", ts.Address, s.cfg.Temporal.Namespace,
		ts.Kind, state, s.path("temporal.log"), time.Since(started).Round(100*time.Millisecond))
	if ts.UIURL != "" {
		s.show("Temporal UI", "%s/namespaces/%s/workflows", ts.UIURL, s.cfg.Temporal.Namespace)
	}
	return nil
}

// openOutbox connects the outbox to the database and Temporal, migrates the schema and
// serves the metrics. demoTopics routes the demo's topic when no config file was given.
func (s *session) openOutbox(ctx context.Context, demoTopics bool) error {
	if demoTopics && !s.o.NoDemo {
		s.cfg.Topics = demo.Topics("http://" + loopback(s.o.InventoryAddr))
		maps.Copy(s.cfg.Topics, demo.TeamTopics())
		s.teamTopics = true
		if s.o.Broker == "nats" {
			if err := s.startBroker(ctx); err != nil {
				return err
			}
			maps.Copy(s.cfg.Topics, demo.BrokerTopics(s.o.NATSURL))
		}
	}
	a, err := app.Open(ctx, s.cfg, app.Options{Logger: s.logger, Databases: cli.Databases})
	if err != nil {
		if s.givenDatabase && app.IsUnavailable(err) {
			return fmt.Errorf("%w\noutbox dev uses the database of DATABASE_URL (or database_url) instead of starting its own; a shell that sourced %s has an earlier outbox dev's: unset DATABASE_URL and TEMPORAL_ADDRESS to let outbox dev start its own", err, s.path(envFile))
		}
		return err
	}
	s.app = a
	s.stops = append(s.stops, a.Close)
	a.StartTracing(ctx)
	if _, err := a.Migrate(ctx); err != nil {
		return err
	}
	if err := a.DialTemporal(ctx); err != nil {
		return err
	}
	// The worker and the relay share one registry and one endpoint (metrics.address).
	metricsAddr, err := a.ServeMetrics()
	if err != nil {
		return err
	}
	if metricsAddr != nil {
		s.show("Metrics", "http://%s/metrics  (/healthz, /readyz)", metricsAddr)
	}
	return nil
}

// startDemo starts the demo's order and inventory services.
func (s *session) startDemo(ctx context.Context) error {
	cfg := demo.Config{OrdersAddr: s.o.OrdersAddr, InventoryAddr: s.o.InventoryAddr, FailRate: s.o.FailRate, Logger: s.logger, TeamTopics: s.teamTopics, BrokerTopic: s.o.Broker != ""}
	// PostgreSQL's pool and store, or MySQL's store (whose connections the demo shares).
	if err := cfg.UseApp(s.app); err != nil {
		return err
	}
	d, err := demo.Start(ctx, cfg)
	if err != nil {
		return err
	}
	s.stops = append(s.stops, d.Close)
	if s.teamTopics {
		// The teams' own workers, on their own task queues, as in a mixed fleet.
		stop, err := demo.StartTeamWorkers(s.app.Temporal, s.logger)
		if err != nil {
			return err
		}
		s.stops = append(s.stops, stop)
		s.show("Demo teams", "%s: activity AwardPoints on task queue %s; %s: workflow FulfilOrder on task queue %s",
			demo.TopicOrderPoints, demo.LoyaltyTaskQueue, demo.TopicOrderFulfil, demo.FulfilmentTaskQueue)
	}
	s.show("Demo orders", "POST %s/orders", d.OrdersURL)
	s.show("Demo inventory", "POST %s/events  (fail some: curl -X POST '%s/fail?rate=0.5')", d.InventoryURL, d.InventoryURL)
	return nil
}

// runWorkerAndRelay runs the worker and the relay in this process (App.Run: the relay
// starts each workflow eagerly on the worker's client) until the session stops, and then
// stops them in order, the relay first; the channel reports their failure.
func (s *session) runWorkerAndRelay(ctx context.Context) <-chan error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	errs := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.app.Run(runCtx, app.Handlers{}); err != nil {
			errs <- err
		}
	}()
	s.stops = append(s.stops, func() { cancel(); <-done })
	s.show("Worker, relay", "task queue %s, topics %s", s.app.Config.Temporal.TaskQueue, topicList(s.app.Config))
	return errs
}

// envFile is the file of the dev folder that other commands source to reach this run.
const envFile = "env"

// writeEnvFile writes the environment other commands (outbox enqueue, outbox stats, the
// examples) need to use this run's database and Temporal server.
func (s *session) writeEnvFile() error {
	body := fmt.Sprintf("# The environment of the running outbox dev; source it: . %s\nexport DATABASE_URL='%s'\nexport TEMPORAL_ADDRESS='%s'\nexport TEMPORAL_NAMESPACE='%s'\n",
		s.path(envFile), s.cfg.DatabaseURL, s.cfg.Temporal.Address, s.cfg.Temporal.Namespace)
	if err := os.WriteFile(filepath.Join(s.o.Dir, envFile), []byte(body), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", s.path(envFile), err)
	}
	s.show("Environment", ". %s  (DATABASE_URL and TEMPORAL_ADDRESS for other commands)", s.path(envFile))
	return nil
}

// prepareDir creates the dev folder and takes its lock for the session (release gives it
// back), then wipes the folder when reset is set. A folder that has files but no marker is
// not a dev folder: --reset never wipes it (nor leaves a lock file in it). A folder
// another outbox dev holds is not wiped either.
func prepareDir(dir string, reset bool) (release func(), err error) {
	marker := filepath.Join(dir, markerFile)
	_, markerErr := os.Stat(marker)
	if reset && markerErr != nil {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			return nil, fmt.Errorf("--reset: %s is not an outbox dev folder (it has no %s file); refusing to wipe it", dir, markerFile)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	if release, err = lockDir(dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	if reset && markerErr == nil {
		// Everything but the lock this session holds.
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("--reset: %w", err)
		}
		for _, e := range entries {
			if e.Name() == sessionLock {
				continue
			}
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("--reset: %w", err)
			}
		}
		if err := pgcluster.RemoveRelocated(dir); err != nil {
			return nil, fmt.Errorf("--reset: %w", err)
		}
	}
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(marker, []byte("This folder holds the data of `outbox dev`; `outbox dev --reset` wipes it.\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return release, nil
}

// loopback turns a listen address into one a client on this machine can dial.
func loopback(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// RedactURL describes a connection string, PostgreSQL's or MySQL's, without its password.
func RedactURL(url string) string {
	if kind, _ := config.DatabaseKind(url); kind == config.DatabaseMySQL {
		c, err := mysqlstore.ParseURL(url)
		if err != nil {
			return "unparsable"
		}
		return fmt.Sprintf("%s@%s/%s", c.User, c.Addr, c.DBName)
	}
	c, err := pgx.ParseConfig(url)
	if err != nil {
		return "unparsable"
	}
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

func topicList(c config.Config) string {
	var names []string
	for t := range c.Topics {
		names = append(names, t)
	}
	slices.Sort(names)
	if c.Default != nil {
		names = append(names, "(default)")
	}
	if len(names) == 0 {
		return "none configured"
	}
	return strings.Join(names, ", ")
}

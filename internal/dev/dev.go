// Package dev is `outbox dev`: the whole system in one process for a developer's machine.
// It starts a private PostgreSQL cluster (unless DATABASE_URL is set), the Temporal server
// with its Web UI in-process (unless TEMPORAL_ADDRESS is set), the worker, the relay and
// the demo services, and on Ctrl-C stops them all, PostgreSQL included.
//
// This package links the Temporal server; library packages must not import it.
package dev

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/app"
	"github.com/outbox-go/outbox/internal/cli"
	"github.com/outbox-go/outbox/internal/demo"
)

// markerFile marks a folder as a dev folder, so --reset never wipes anything else.
const markerFile = ".outbox-dev"

// Options are the flags of outbox dev.
type Options struct {
	Dir       string
	Reset     bool
	Ephemeral bool
	Only      string

	PGBinDir string
	PGPort   int

	Temporal TemporalOptions

	NoDemo        bool
	OrdersAddr    string
	InventoryAddr string
	FailRate      float64
}

// Command returns the dev subcommand.
func Command(env *cli.Env) *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system locally: PostgreSQL, Temporal with its Web UI, worker, relay and a demo",
		Long: `Runs everything in one process, with no Docker:

  PostgreSQL    DATABASE_URL if set, else a private cluster in --dir made with the local
                PostgreSQL server programs (--pg-bin-dir, OUTBOX_PG_BIN_DIR, PATH, or the
                usual install folders)
  Temporal      TEMPORAL_ADDRESS if set, else the Temporal server in this process, its state
                in --dir (--ephemeral: in memory), frontend on 127.0.0.1:7233 and the Web UI
                on http://127.0.0.1:8233
  worker, relay the outbox itself
  demo          an order service and an inventory service (see outbox demo --help)

Without --config the demo's topic order.created is routed to the demo inventory service.
Ctrl-C stops everything, PostgreSQL included. --only temporal runs just the Temporal server
and UI.`,
		Example: `  go run ./cmd/outbox dev
  curl -s -X POST http://127.0.0.1:8080/orders -d '{"sku": "SKU-1", "qty": 2}'
  open http://127.0.0.1:8233`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.PGBinDir == "" {
				o.PGBinDir, _ = env.LookupEnv("OUTBOX_PG_BIN_DIR")
			}
			return Run(cmd.Context(), env, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", ".outbox-dev", "folder for PostgreSQL's and Temporal's data and logs")
	f.BoolVar(&o.Reset, "reset", false, "wipe --dir first (PostgreSQL data included)")
	f.BoolVar(&o.Ephemeral, "ephemeral", false, "keep Temporal's state in memory")
	f.StringVar(&o.Only, "only", "", `run only one part: "temporal" (the server and its UI)`)
	f.StringVar(&o.PGBinDir, "pg-bin-dir", "", "folder with initdb and postgres (default: $OUTBOX_PG_BIN_DIR, PATH, /usr/lib/postgresql/*/bin, ...)")
	f.IntVar(&o.PGPort, "pg-port", 0, "port of the private PostgreSQL (default: the last one if free, else any free port)")
	f.StringVar(&o.Temporal.IP, "ip", "127.0.0.1", "IP the Temporal services bind to")
	f.IntVar(&o.Temporal.FrontendPort, "port", 7233, "Temporal frontend (gRPC) port")
	f.IntVar(&o.Temporal.HistoryPort, "history-port", 0, "Temporal history service port (default: --port + 1)")
	f.IntVar(&o.Temporal.MatchingPort, "matching-port", 0, "Temporal matching service port (default: --port + 2)")
	f.IntVar(&o.Temporal.WorkerPort, "worker-port", 0, "Temporal worker service port (default: --port + 3)")
	f.IntVar(&o.Temporal.FrontendHTTPPort, "http-port", 0, "Temporal frontend HTTP API port (default: off)")
	f.StringVar(&o.Temporal.UIIP, "ui-ip", "127.0.0.1", "IP the Web UI binds to")
	f.IntVar(&o.Temporal.UIPort, "ui-port", 8233, "Web UI port (0: no UI)")
	f.StringVar(&o.Temporal.Namespace, "namespace", "default", "Temporal namespace")
	f.BoolVar(&o.NoDemo, "no-demo", false, "do not run the demo services")
	f.StringVar(&o.OrdersAddr, "orders-addr", "127.0.0.1:8080", "listen address of the demo order service")
	f.StringVar(&o.InventoryAddr, "inventory-addr", "127.0.0.1:8081", "listen address of the demo inventory service")
	f.Float64Var(&o.FailRate, "fail-rate", 0, "share of demo inventory requests answered with 503, 0 to 1")
	return cmd
}

// Run runs the dev system until ctx is cancelled.
func Run(ctx context.Context, env *cli.Env, o Options, out io.Writer) (err error) {
	if o.Only != "" && o.Only != "temporal" {
		return fmt.Errorf(`--only must be "temporal", got %q`, o.Only)
	}
	logger, err := env.Logger()
	if err != nil {
		return err
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if err := prepareDir(o.Dir, o.Reset); err != nil {
		return err
	}
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	lines := []string{}
	show := func(name, format string, args ...any) {
		lines = append(lines, fmt.Sprintf("  %-15s %s", name, fmt.Sprintf(format, args...)))
	}

	// PostgreSQL.
	var pgExited <-chan struct{}
	if o.Only == "" {
		if cfg.DatabaseURL == "" {
			binDir, err := findPGBinDir(o.PGBinDir, exec.LookPath)
			if err != nil {
				return err
			}
			pg, err := startPG(ctx, binDir, filepath.Join(o.Dir, "postgres"), o.PGPort, filepath.Join(o.Dir, "postgres.log"))
			if err != nil {
				return err
			}
			stops = append(stops, pg.Stop)
			pgExited = pg.Exited()
			cfg.DatabaseURL = pg.URL()
			show("PostgreSQL", "%s  (pid %d, data in %s, log %s)", pg.URL(), pg.PID(), filepath.Join(o.Dir, "postgres"), filepath.Join(o.Dir, "postgres.log"))
		} else {
			show("PostgreSQL", "DATABASE_URL (%s)", redact(cfg.DatabaseURL))
		}
	}

	// Temporal.
	if cfg.Temporal.Address == "" || o.Only == "temporal" {
		t := o.Temporal
		t.LogFile = filepath.Join(o.Dir, "temporal.log")
		if !o.Ephemeral {
			t.DatabaseFile = filepath.Join(o.Dir, "temporal.db")
		}
		if cfg.Temporal.Namespace != "" {
			t.Namespace = cfg.Temporal.Namespace
		}
		ts, err := startTemporal(t)
		if err != nil {
			return err
		}
		stops = append(stops, ts.Stop)
		cfg.Temporal.Address = ts.address
		cfg.Temporal.Namespace = cmp.Or(t.Namespace, "default")
		state := "in memory"
		if t.DatabaseFile != "" {
			state = "in " + t.DatabaseFile
		}
		show("Temporal", "%s  namespace %s  (state %s, log %s)", ts.address, cfg.Temporal.Namespace, state, t.LogFile)
		if ts.uiURL != "" {
			show("Temporal UI", "%s/namespaces/%s/workflows", ts.uiURL, cfg.Temporal.Namespace)
		}
	} else {
		show("Temporal", "TEMPORAL_ADDRESS %s  namespace %s", cfg.Temporal.Address, cmp.Or(cfg.Temporal.Namespace, "default"))
	}

	if o.Only == "temporal" {
		fmt.Fprintf(out, "outbox dev (temporal only) is ready; Ctrl-C stops it\n%s\n", strings.Join(lines, "\n"))
		<-ctx.Done()
		return nil
	}

	// The outbox itself.
	inventoryURL := "http://" + loopback(o.InventoryAddr)
	if env.ConfigPath() == "" && !o.NoDemo {
		cfg.Topics = demo.Topics(inventoryURL)
	}
	a, err := app.Open(ctx, cfg, logger)
	if err != nil {
		return err
	}
	stops = append(stops, a.Close)
	a.StartTracing(ctx)
	if _, err := a.Store.Migrate(ctx); err != nil {
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
		show("Metrics", "http://%s/metrics  (/healthz, /readyz)", metricsAddr)
	}

	if !o.NoDemo {
		s, err := demo.Start(ctx, demo.Config{Pool: a.Pool, Store: a.Store, OrdersAddr: o.OrdersAddr, InventoryAddr: o.InventoryAddr, FailRate: o.FailRate, Logger: logger})
		if err != nil {
			return err
		}
		stops = append(stops, s.Close)
		show("Demo orders", "POST %s/orders", s.OrdersURL)
		show("Demo inventory", "POST %s/events  (fail some: curl -X POST '%s/fail?rate=0.5')", s.InventoryURL, s.InventoryURL)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, part := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"worker", func(ctx context.Context) error { return a.RunWorker(ctx, nil) }},
		{"relay", a.RunRelay},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := part.run(runCtx); err != nil {
				errs <- fmt.Errorf("%s: %w", part.name, err)
			}
		}()
	}
	stops = append(stops, func() { cancel(); wg.Wait() })
	show("Worker, relay", "task queue %s, topics %s", a.Config.Temporal.TaskQueue, topicList(a.Config))

	fmt.Fprintf(out, "outbox dev is ready; Ctrl-C stops everything\n%s\n", strings.Join(lines, "\n"))
	if !o.NoDemo {
		fmt.Fprintf(out, "\nTry:\n  curl -s -X POST http://%s/orders -d '{\"sku\": \"SKU-1\", \"qty\": 2}'\n", loopback(o.OrdersAddr))
	}

	select {
	case <-ctx.Done():
		logger.Info("Shutting down")
		return nil
	case err := <-errs:
		return err
	case <-pgExited:
		return errors.New("PostgreSQL exited; see its log in " + filepath.Join(o.Dir, "postgres.log"))
	}
}

// prepareDir creates the dev folder, wiping it first when reset is set. A folder that has
// files but no marker is not a dev folder and is never wiped.
func prepareDir(dir string, reset bool) error {
	marker := filepath.Join(dir, markerFile)
	if reset {
		if _, err := os.Stat(marker); err == nil {
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("--reset: %w", err)
			}
		} else if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			return fmt.Errorf("--reset: %s is not an outbox dev folder (it has no %s file); refusing to wipe it", dir, markerFile)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		return os.WriteFile(marker, []byte("This folder holds the data of `outbox dev`; `outbox dev --reset` wipes it.\n"), 0o644)
	}
	return nil
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

// redact describes a connection string without its password.
func redact(url string) string {
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
	if c.Default != nil {
		names = append(names, "(default)")
	}
	if len(names) == 0 {
		return "none configured"
	}
	return strings.Join(names, ", ")
}

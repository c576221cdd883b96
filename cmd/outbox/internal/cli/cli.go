// Package cli is the outbox command line; cmd/outbox only calls [Main].
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/cmd/outbox/internal/demo"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
)

// Main runs the outbox command with the process's arguments and environment, and exits
// with the code [ExitCode] gives its error.
func Main(extra ...func(*Env) *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	root := NewRoot(os.Stdin, os.Stdout, os.Stderr, os.LookupEnv, extra...)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(ExitCode(err))
	}
}

// globals are the flags every subcommand has.
type globals struct {
	configPath string
	logLevel   string
	logFormat  string
	lookupEnv  func(string) (string, bool)
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
}

// NewRoot returns the outbox command; lookupEnv is os.LookupEnv in the binary.
//
// extra adds commands that live outside this package (outbox dev, which links the Temporal
// server); each gets the shared flags and environment through an Env.
func NewRoot(stdin io.Reader, stdout, stderr io.Writer, lookupEnv func(string) (string, bool), extra ...func(*Env) *cobra.Command) *cobra.Command {
	g := &globals{lookupEnv: lookupEnv, stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "outbox",
		Short: "A Temporal-native transactional outbox for PostgreSQL",
		Long: `outbox delivers the messages that business transactions write into the
outbox_messages table: a relay turns each committed row into a Temporal workflow
(ID outbox-<message_id>) that sends it, marks it sent, or dead-letters it.

Environment variables DATABASE_URL, TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE and
OUTBOX_TASK_QUEUE override the config file.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       ReadBuildInfo().String(),
		// Any arguments reach RunE, which names an unknown command as a usage error (cobra
		// would return it before any command runs, without a way to tell it from others).
		// markUsageErrors gives the commands that group others (dlq, topic, ...) the same.
		Args: cobra.ArbitraryArgs,
		RunE: runGroup,
	}
	root.SuggestionsMinimumDistance = 2
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.configPath, "config", "", "YAML config `file`")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	root.AddCommand(
		newMigrateCmd(g),
		newWorkerCmd(g),
		newRelayCmd(g),
		newRunCmd(g),
		newEnqueueCmd(g),
		newDemoCmd(g),
		newShowCmd(g),
		newDLQCmd(g),
		newTopicCmd(g),
		newStatsCmd(g),
		newRetentionCmd(g),
		newCodecServerCmd(g),
		newConfigCmd(g),
		newVersionCmd(),
	)
	for _, add := range extra {
		root.AddCommand(add(g.Env()))
	}
	markUsageErrors(root)
	return root
}

// runGroup runs a command that groups others (outbox itself, outbox dlq, ...): its help
// without arguments, else a usage error naming the unknown command. Cobra would print the
// help of a group that cannot run and succeed, so a mistyped `outbox dlq redirve` in a
// script would look done.
func runGroup(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	of := ""
	if cmd.HasParent() {
		of = fmt.Sprintf(" for %q", cmd.CommandPath())
	}
	msg := fmt.Sprintf("unknown command %q%s; run %s --help for the commands", args[0], of, cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg = fmt.Sprintf("unknown command %q%s; did you mean %s?", args[0], of, strings.Join(s, " or "))
	}
	return usageErrorf("%s", msg)
}

// markUsageErrors makes the argument checks of cmd and its subcommands return usage errors,
// so the command exits with ExitUsage when the arguments are wrong, and makes each command
// that only groups others run runGroup.
func markUsageErrors(cmd *cobra.Command) {
	if !cmd.Runnable() && cmd.HasSubCommands() {
		cmd.Args, cmd.RunE = cobra.ArbitraryArgs, runGroup
		cmd.SuggestionsMinimumDistance = 2
	}
	if check := cmd.Args; check != nil && cmd.HasParent() {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsageErrors(sub)
	}
}

// config loads the config file and applies the environment.
func (g *globals) config() (*config.Config, error) {
	cfg, err := config.LoadEnv(g.configPath, g.lookupEnv)
	if err != nil {
		return nil, &app.ConfigError{Err: err}
	}
	return cfg, nil
}

func (g *globals) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, usageErrorf("--log-level must be debug, info, warn or error, got %q", g.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(g.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(g.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(g.stderr, opts)), nil
	default:
		return nil, usageErrorf("--log-format must be text or json, got %q", g.logFormat)
	}
}

// open loads the config and connects to the database (and Temporal when withTemporal).
func (g *globals) open(ctx context.Context, withTemporal bool) (*app.App, error) {
	logger, err := g.logger()
	if err != nil {
		return nil, err
	}
	cfg, err := g.config()
	if err != nil {
		return nil, err
	}
	if withTemporal {
		return app.Connect(ctx, cfg, app.Options{Logger: logger, Databases: Databases})
	}
	a, err := app.Open(ctx, cfg, app.Options{Logger: logger, Databases: Databases})
	if err != nil {
		return nil, err
	}
	a.StartTracing(ctx)
	return a, nil
}

// withApp opens the App for a command, runs fn with it and closes it.
func (g *globals) withApp(ctx context.Context, withTemporal bool, fn func(*app.App) error) error {
	a, err := g.open(ctx, withTemporal)
	if err != nil {
		return err
	}
	defer a.Close()
	return fn(a)
}

// serve is withApp for the commands that run until they are stopped (worker, relay,
// run): one stopped (SIGTERM, Ctrl-C) while it still connects did what it was asked, as
// when it is stopped later, and exits 0, not 69 for a connection its stop cut short.
func (g *globals) serve(ctx context.Context, fn func(*app.App) error) error {
	err := g.withApp(ctx, true, fn)
	if err != nil && ctx.Err() != nil && (app.IsUnavailable(err) || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

func newMigrateCmd(g *globals) *cobra.Command {
	var (
		moveTaskQueue bool
		printSQL      bool
		from          int
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox tables (running it again is a no-op)",
		Long: `Create or upgrade the outbox tables (running it again is a no-op).

The first migrate records the config's task queue (temporal.task_queue) as this outbox
database's: a task queue belongs to one outbox database, and a relay or worker configured
with another refuses to start. --move-task-queue records the config's task queue in its
place; do it once no delivery runs on the old one any more.

--print prints the SQL instead, for a migration tool of your own (goose, Flyway, Atlas,
sqitch), and connects to nothing: the migrations for the config's schema, each followed by
the INSERT that records it in outbox_schema_migrations, so outbox migrate later finds them
applied. The script has no BEGIN or COMMIT: run it in one transaction (the tool's). It
records no task queue: the first relay or worker to start records its own. --from N prints
the migrations from version N on, for a schema migrated up to N-1.`,
		Example: `  outbox migrate
  outbox migrate --print > V1__outbox.sql
  outbox migrate --print --from 9 > V7__outbox_0009.sql`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printSQL {
				if moveTaskQueue {
					return usageErrorf("--move-task-queue writes to the database and cannot be used with --print")
				}
				return printMigrationSQL(cmd, g, from)
			}
			if cmd.Flags().Changed("from") {
				return usageErrorf("--from %d needs --print: outbox migrate applies every migration the schema lacks", from)
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				applied, err := a.Migrate(cmd.Context())
				if err != nil {
					return err
				}
				if moveTaskQueue {
					if err := a.MoveTaskQueue(cmd.Context()); err != nil {
						return err
					}
				}
				if len(applied) == 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "schema %s is up to date\n", a.Driver.Schema())
				}
				for _, v := range applied {
					fmt.Fprintf(cmd.OutOrStdout(), "applied migration %04d to schema %s\n", v, a.Driver.Schema())
				}
				id, tq, err := a.Driver.Deployment(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deployment %s, task queue %s\n", id, tq)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&moveTaskQueue, "move-task-queue", false, "record the config's task queue as this database's, replacing the one recorded")
	cmd.Flags().BoolVar(&printSQL, "print", false, "print the migrations' SQL for the config's schema instead of running it (connects to nothing)")
	cmd.Flags().IntVar(&from, "from", 1, "with --print, print the migrations from this `version` on")
	return cmd
}

// printMigrationSQL writes the SQL of the migrations from version from on for the config's
// schema (store.MigrationSQL), without connecting to the database.
func printMigrationSQL(cmd *cobra.Command, g *globals, from int) error {
	migrations, err := store.Migrations()
	if err != nil {
		return err
	}
	first, last := migrations[0].Version, migrations[len(migrations)-1].Version
	if from < first || from > last {
		return usageErrorf("--from must be a migration version from %d to %d, got %d", first, last, from)
	}
	cfg, err := g.config()
	if err != nil {
		return err
	}
	if kind, _ := config.DatabaseKind(cfg.DatabaseURL); kind == config.DatabaseMySQL {
		return &app.ConfigError{Err: errors.New("--print prints PostgreSQL's migrations; on MySQL and MariaDB run outbox migrate, " +
			"which fills in the server's binary collation (the SQL, with its placeholders, is in store/mysqlstore/migrations)")}
	}
	sql, err := store.MigrationSQL(cfg.WithDefaults().Schema, from)
	if err != nil {
		return &app.ConfigError{Err: err}
	}
	_, err = io.WriteString(cmd.OutOrStdout(), sql)
	return err
}

func newWorkerCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "worker",
		Short: "Run the Temporal worker: the delivery workflow and its activities",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.serve(cmd.Context(), func(a *app.App) error {
				return a.RunWorker(cmd.Context(), app.Handlers{})
			})
		},
	}
}

func newRunCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the worker and the relay in one process, with eager workflow start",
		Long: `Run runs what worker and relay run, in one process: the shape most deployments want.
The relay starts each delivery workflow eagerly, so Temporal hands its first workflow task
straight to this process's worker. Several run processes (or separate relays and workers)
may run against one database and namespace.

On SIGTERM the relay stops first, then the worker lets its sends in flight finish within
worker.stop_timeout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.serve(cmd.Context(), func(a *app.App) error {
				return a.Run(cmd.Context(), app.Handlers{})
			})
		},
	}
}

func newRelayCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "relay",
		Short: "Run the relay: start one delivery workflow per committed outbox row",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.serve(cmd.Context(), func(a *app.App) error {
				return a.RunRelay(cmd.Context())
			})
		},
	}
}

func newEnqueueCmd(g *globals) *cobra.Command {
	var (
		payload       string
		headers       []string
		maxRetryTimes int
		deliverAfter  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "enqueue TOPIC",
		Short: "Enqueue a message: JSON payload from --payload or standard input; prints its message ID",
		Example: `  outbox enqueue order.created --payload '{"order_id": 7}'
  echo '{"order_id": 7}' | outbox enqueue order.created --max-retry-times 2
  outbox enqueue order.created --payload '{"order_id": 7}' --deliver-after 30s`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := []byte(payload)
			if !cmd.Flags().Changed("payload") {
				var err error
				if body, err = io.ReadAll(cmd.InOrStdin()); err != nil {
					return fmt.Errorf("read payload from standard input: %w", err)
				}
			}
			msg, err := buildMessage(args[0], body, headers)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("max-retry-times") {
				if maxRetryTimes < 0 || maxRetryTimes > store.MaxRetryTimesLimit {
					return usageErrorf("--max-retry-times must be between 0 and %d, got %d", store.MaxRetryTimesLimit, maxRetryTimes)
				}
				msg.MaxRetryTimes = &maxRetryTimes
			}
			if deliverAfter < 0 || deliverAfter > maxDeliverAfter {
				return usageErrorf("--deliver-after must be between 0 and %s (a year), got %s", maxDeliverAfter, deliverAfter)
			}
			if deliverAfter > 0 {
				msg.DeliverAfter = time.Now().Add(deliverAfter)
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				id, err := a.Enqueue(cmd.Context(), msg)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&payload, "payload", "", "JSON payload (default: read from standard input)")
	cmd.Flags().StringArrayVar(&headers, "header", nil, "message header `key=value` (repeatable)")
	cmd.Flags().IntVar(&maxRetryTimes, "max-retry-times", 0, "retries after the first attempt, 0 to 100 (default: the topic's max_attempts)")
	cmd.Flags().DurationVar(&deliverAfter, "deliver-after", 0, "deliver no earlier than this `duration` from now, e.g. 30s or 2h, at most 1 year (default: at once)")
	return cmd
}

// maxDeliverAfter is the longest --deliver-after: a year, as Enqueue allows (365 days; a
// leap year's extra day is left to the library's own check).
const maxDeliverAfter = 365 * 24 * time.Hour

func buildMessage(topic string, payload []byte, headers []string) (store.Message, error) {
	msg := store.Message{Topic: topic, Payload: payload}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return msg, usageErrorf("--header must be key=value, got %q", h)
		}
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[k] = v
	}
	return msg, nil
}

// Env gives a command defined outside this package the global flags' values.
type Env struct{ g *globals }

// Env returns the accessor of g for commands defined elsewhere.
func (g *globals) Env() *Env { return &Env{g} }

// ConfigPath is the value of --config ("" when not given).
func (e *Env) ConfigPath() string { return e.g.configPath }

// Config loads --config (or the defaults) and applies the environment.
func (e *Env) Config() (*config.Config, error) { return e.g.config() }

// Logger returns the logger --log-level and --log-format ask for.
func (e *Env) Logger() (*slog.Logger, error) { return e.g.logger() }

// LookupEnv looks up an environment variable.
func (e *Env) LookupEnv(name string) (string, bool) { return e.g.lookupEnv(name) }

func newDemoCmd(g *globals) *cobra.Command {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the demo order and inventory services against DATABASE_URL",
		Long: `Runs two small services that show the outbox at work:

  POST /orders (order service)      writes an order and its order.created message in one transaction
  POST /events (inventory service)  reserves stock once per message ID, however often it arrives
  GET  /events/{message_id}         200 if the message was received, 404 if not (check_url)
  POST /fail?rate=0.5               makes the inventory service answer 503 to that share of requests

An order with "sku": "POISON" is rejected with 422, so its message is dead-lettered.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !(cfg.FailRate >= 0 && cfg.FailRate <= 1) { // NaN too
				return usageErrorf("--fail-rate must be between 0 and 1, got %g", cfg.FailRate)
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				if err := cfg.UseApp(a); err != nil {
					return err
				}
				cfg.Logger = a.Logger
				s, err := demo.Start(cmd.Context(), cfg)
				if err != nil {
					return err
				}
				defer s.Close()
				fmt.Fprintf(cmd.OutOrStdout(), "demo order service on %s/orders, inventory service on %s/events\n", s.OrdersURL, s.InventoryURL)
				select {
				case <-cmd.Context().Done():
					return nil
				case err := <-s.Err():
					return err
				}
			})
		},
	}
	cmd.Flags().StringVar(&cfg.OrdersAddr, "orders-addr", "127.0.0.1:8080", "listen address of the order service")
	cmd.Flags().StringVar(&cfg.InventoryAddr, "inventory-addr", "127.0.0.1:8081", "listen address of the inventory service")
	cmd.Flags().Float64Var(&cfg.FailRate, "fail-rate", 0, "share of inventory requests answered with 503, 0 to 1")
	return cmd
}

package app_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
)

// A team's outbox process: the relay and the worker in one process, from the same config
// file outbox worker and outbox relay read, with one topic handled by Go code. It needs
// PostgreSQL and a Temporal server (the config's temporal.address). Split across processes,
// one runs a.RunRelay(ctx) and the others a.RunWorker(ctx, handlers).
func ExampleApp_Run() {
	cfg, err := config.Load("outbox.yaml") // DATABASE_URL, TEMPORAL_ADDRESS, ... override the file
	if err != nil {
		log.Fatal(err)
	}
	// SIGTERM (a pod being stopped) or Ctrl-C stops the relay first, then the worker, which
	// lets the sends in flight finish within worker.stop_timeout.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	a, err := app.Connect(ctx, cfg, app.Options{Logger: logger})
	switch {
	case app.IsConfigError(err):
		log.Fatalf("outbox.yaml: %v", err) // a restart does not help: fix the config
	case err != nil:
		log.Fatal(err) // PostgreSQL or Temporal does not answer (app.IsUnavailable): restart later
	}

	err = a.Run(ctx, app.Handlers{Topics: map[string]delivery.Handler{
		// The config's topics go to their sinks; this one is handled here.
		"loyalty.points": delivery.HandlerFunc(func(ctx context.Context, d delivery.Message) error {
			// Credit the points in d.Payload, keyed by d.MessageID so that a repeat is a no-op.
			return nil
		}),
	}})
	a.Close()
	if err != nil {
		log.Fatal(err) // the relay or the worker failed
	}
}

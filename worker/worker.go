// Package worker puts the outbox's workflow and activities on a Temporal worker: Register
// adds them to a worker a team already runs, Run runs a worker of their own.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// Deps are what the activities need.
type Deps struct {
	Store    *store.Store
	Handlers *activities.Registry
	Logger   *slog.Logger // defaults to slog.Default()
	// Alerts posts a webhook for each dead letter. Optional.
	Alerts *activities.AlertWebhooks
	// Metrics records sends, sent and dead-lettered messages. Optional.
	Metrics *metrics.Metrics
	// Client signals teams' workflows for topics with a signal (Run sets it to its own
	// client when it is nil). Optional otherwise.
	Client client.Client
}

// Register adds OutboxDelivery and its activities to r, which is usually a worker on the
// outbox's task queue.
func Register(r sdkworker.Registry, deps Deps) {
	r.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	r.RegisterWorkflowWithOptions(workflows.Retention, workflows.RetentionRegisterOptions())
	if deps.Handlers != nil {
		deps.Metrics.KnownTopics(deps.Handlers.Topics()...)
	}
	a := &activities.Activities{Store: deps.Store, Handlers: deps.Handlers, Logger: deps.Logger, Alerts: deps.Alerts, Metrics: deps.Metrics, Client: deps.Client}
	a.Register(r)
}

// Config configures Run.
type Config struct {
	Client client.Client
	// TaskQueue defaults to "outbox".
	TaskQueue string
	Deps
	// Options are passed to the SDK worker as they are; the zero value is fine.
	Options sdkworker.Options
}

// Run runs a worker until ctx is cancelled, then stops it gracefully.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Client == nil || cfg.Store == nil || cfg.Handlers == nil {
		return errors.New("worker: Client, Store and Handlers are required")
	}
	taskQueue := cmp.Or(cfg.TaskQueue, workflows.DefaultTaskQueue)
	logger := cmp.Or(cfg.Logger, slog.Default())
	// A fatal error (the namespace is gone, permission denied) stops the SDK worker's
	// polling; Run returns it instead of idling as if all were well.
	fatal := make(chan error, 1)
	opts := cfg.Options
	onFatal := opts.OnFatalError
	opts.OnFatalError = func(err error) {
		if onFatal != nil {
			onFatal(err)
		}
		select {
		case fatal <- err:
		default:
		}
	}
	w := sdkworker.New(cfg.Client, taskQueue, opts)
	deps := cfg.Deps
	if deps.Client == nil {
		deps.Client = cfg.Client
	}
	Register(w, deps)
	if err := w.Start(); err != nil {
		return fmt.Errorf("start worker on task queue %s: %w", taskQueue, err)
	}
	logger.InfoContext(ctx, "Worker started", slog.String("task_queue", taskQueue), slog.Any("topics", cfg.Handlers.Topics()))
	select {
	case <-ctx.Done():
		w.Stop()
		logger.InfoContext(context.WithoutCancel(ctx), "Worker stopped")
		return nil
	case err := <-fatal:
		w.Stop()
		return fmt.Errorf("worker on task queue %s stopped: %w", taskQueue, err)
	}
}

// Package worker puts the outbox's workflow and activities on a Temporal worker: Register
// adds them to a worker a team already runs, Run runs a worker of their own.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/internal/deployment"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/storedriver"
	"github.com/outbox-go/outbox/workflows"
)

// Deps are what the activities need.
type Deps struct {
	Store    store.Delivery
	Handlers *activities.Registry
	Logger   *slog.Logger // defaults to slog.Default()
	// Alerts posts a webhook for each dead letter. Optional.
	Alerts *activities.AlertWebhooks
	// Metrics records sends, sent and dead-lettered messages. Optional.
	Metrics *metrics.Metrics
	// Client signals teams' workflows for topics with a signal (Run sets it to its own
	// client when it is nil). Optional otherwise.
	Client client.Client
	// Deployment is the deployment ID of Store (store.Store.DeploymentID). Run, when it is
	// unset, checks the task queue (CheckTaskQueue) and fills it; set, it was checked
	// already (app.PrepareWorker does, and returns it).
	// When set, Register registers OutboxDelivery guarded by it (workflows.DeliveryOf): a
	// run of another outbox database's message fails its workflow tasks on this worker,
	// which Temporal retries, and never runs a step here. That needs the SDK's default
	// WorkflowPanicPolicy, BlockWorkflow.
	Deployment uuid.UUID
	// MaxSendsPerTopic caps the sends of one topic this worker runs at once (see
	// activities.Activities.MaxSendsPerTopic). 0 means no cap when the activities are
	// registered with Register; Run caps at half the worker's local activity slots.
	MaxSendsPerTopic int
}

// Register adds OutboxDelivery, OutboxBatch and their activities to r, which is usually a
// worker on the outbox's task queue.
func Register(r sdkworker.Registry, deps Deps) {
	delivery, batch := workflows.Delivery, workflows.Batch
	if deps.Deployment != uuid.Nil {
		delivery, batch = workflows.DeliveryOf(deps.Deployment.String()), workflows.BatchOf(deps.Deployment.String())
	}
	r.RegisterWorkflowWithOptions(delivery, workflows.RegisterOptions())
	r.RegisterWorkflowWithOptions(batch, workflows.BatchRegisterOptions())
	r.RegisterWorkflowWithOptions(workflows.Retention, workflows.RetentionRegisterOptions())
	if deps.Handlers != nil {
		deps.Metrics.KnownTopics(deps.Handlers.Topics()...)
	}
	a := &activities.Activities{Store: deps.Store, Handlers: deps.Handlers, Logger: deps.Logger, Alerts: deps.Alerts, Metrics: deps.Metrics, Client: deps.Client,
		MaxSendsPerTopic: deps.MaxSendsPerTopic}
	a.Register(r)
}

// Options returns opts for an SDK worker of a team's own that Register adds the outbox
// to: its identity names the OutboxDelivery version this build runs and deps' deployment
// (deps.Deployment, which app.PrepareWorker fills), as Run's does. The relays read it to
// start no run at a version this worker cannot run, and other outbox deployments to see
// that the task queue is taken. With no deployment in deps, opts is returned unchanged.
func Options(opts sdkworker.Options, deps Deps) sdkworker.Options {
	if deps.Deployment != uuid.Nil {
		opts.Identity = deployment.Identity(opts.Identity, deps.Deployment)
	}
	return opts
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
//
// Before it starts, it reads the store's deployment and records the task queue on it when
// none is recorded yet; it refuses to start when the database records another task queue,
// or when workers of another outbox deployment poll this one (see CheckTaskQueue): a task
// queue belongs to one outbox database. Its worker identity names its deployment
// (<pid>@<host>@outbox:<deployment-id>) so that the other deployments' checks see it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Client == nil || cfg.Store == nil || cfg.Handlers == nil {
		return errors.New("worker: Client, Store and Handlers are required")
	}
	taskQueue := cmp.Or(cfg.TaskQueue, workflows.DefaultTaskQueue)
	logger := cmp.Or(cfg.Logger, slog.Default())
	if cfg.Options.WorkflowPanicPolicy == sdkworker.FailWorkflow {
		return errors.New("worker: WorkflowPanicPolicy FailWorkflow would fail the runs of another outbox database's messages that reach this worker (and any run that hits a bug) instead of leaving them to be retried: use the default, BlockWorkflow")
	}
	// app.PrepareWorker has checked the task queue when it filled Deployment.
	id := cfg.Deployment
	if id == uuid.Nil {
		var err error
		if id, err = CheckTaskQueue(ctx, cfg.Client, cfg.Store, taskQueue, logger); err != nil {
			return err
		}
	}
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
	deps := cfg.Deps
	if deps.Client == nil {
		deps.Client = cfg.Client
	}
	deps.Deployment = id
	opts = Options(opts, deps)
	w := sdkworker.New(cfg.Client, taskQueue, opts)
	if deps.MaxSendsPerTopic == 0 {
		// Half the slots the sends' first attempts run in (the SDK's default is 1000).
		deps.MaxSendsPerTopic = max(cmp.Or(opts.MaxConcurrentLocalActivityExecutionSize, 1000)/2, 1)
	}
	Register(w, deps)
	if err := w.Start(); err != nil {
		return fmt.Errorf("start worker on task queue %s: %w", taskQueue, err)
	}
	logger.InfoContext(ctx, "Worker started", slog.String("task_queue", taskQueue), slog.String("deployment", id.String()),
		slog.String("identity", opts.Identity), slog.Any("topics", cfg.Handlers.Topics()))
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

// CheckTaskQueue prepares a worker of st's outbox on taskQueue, as Run does before it
// starts: it records taskQueue on the deployment when none is recorded yet, refuses a
// taskQueue other than the recorded one, and refuses to start while a worker of another
// outbox deployment polls taskQueue (its identity names that deployment). It returns the
// deployment ID, for Deps.Deployment and the worker identity
// (<pid>@<host>@outbox:<deployment-id>). A task queue that cannot be described (an API key
// without that permission) is logged, and the worker starts without that check. A
// database that does not answer is waited for (an outage, or a deploy that starts the
// worker first), until ctx ends; one that answers with an error (a schema without the
// migrations: store.ErrNotMigrated, from any store; a permission refused, from a store
// that tells answers apart: storedriver.Answerer) is an error.
func CheckTaskQueue(ctx context.Context, c client.Client, st store.Delivery, taskQueue string, logger *slog.Logger) (uuid.UUID, error) {
	logger = cmp.Or(logger, slog.Default())
	var (
		id       uuid.UUID
		recorded string
		err      error
	)
	answerer, _ := st.(storedriver.Answerer)
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		id, recorded, err = st.RecordTaskQueue(ctx, taskQueue)
		var pgErr *pgconn.PgError
		if err == nil || errors.As(err, &pgErr) || (answerer != nil && answerer.Answered(err)) || errors.Is(err, store.ErrNotMigrated) || ctx.Err() != nil {
			break
		}
		logger.WarnContext(ctx, "Cannot read the outbox deployment; the worker waits for the database", slog.Duration("retry_in", wait), slog.Any("error", err))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("worker: %w", err)
	}
	if recorded != taskQueue {
		return uuid.Nil, fmt.Errorf("worker: %w", &deployment.TaskQueueError{Schema: st.Schema(), Configured: taskQueue, Recorded: recorded})
	}
	descCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = deployment.CheckTaskQueue(descCtx, c, taskQueue, id)
	var conflict *deployment.ConflictError
	switch {
	case errors.As(err, &conflict):
		return uuid.Nil, fmt.Errorf("worker: %w", err)
	case err != nil:
		logger.WarnContext(ctx, "Cannot tell whether another outbox deployment polls the task queue; starting without that check",
			slog.String("task_queue", taskQueue), slog.Any("error", err))
	}
	return id, nil
}

// Package starter is the relay: it turns each committed, due outbox row into one
// OutboxDelivery workflow whose ID is outbox-<message_id>.
//
// The relay wakes on the table's NOTIFY (a hint) and on a poll interval (the guarantee),
// claims a batch of rows with a short lease, starts their workflows concurrently and marks
// each row dispatched unless it has already moved on. The start uses the reuse policy
// ALLOW_DUPLICATE_FAILED_ONLY and the conflict policy FAIL, so a row that is claimed again
// (after a relay crash, or a lost mark-sent) never starts a second delivery of a message
// that a run already delivered: "already started" counts as handed over, and a start
// rejected because a run completed records the row as sent from that run's outcome. The
// one running run that does not count is the run that dead-lettered the message, still
// closing when an operator redrove it: the row is claimed again a moment later, and
// started once that run has failed.
// Several relays may run against one database: the claim's SKIP LOCKED gives each its own
// rows.
package starter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	dmsg "github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/deployment"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// Config configures a Relay.
type Config struct {
	// TaskQueue is where the delivery workflows run. Defaults to "outbox".
	TaskQueue string
	// BatchSize is the number of rows one claim takes. Defaults to 100.
	BatchSize int
	// Wakeup is how the relay learns of new rows: WakeupPoll (the default) claims every
	// PollInterval, which costs the business transactions nothing; WakeupNotify also
	// LISTENs to the table's NOTIFY trigger (see store.Store.SetNotify), which wakes it at
	// once but makes every enqueuing transaction take PostgreSQL's global notify lock at
	// commit.
	Wakeup Wakeup
	// PollInterval is how often the relay claims without a notification. Defaults to
	// PollIntervalDefault (50ms) with WakeupPoll and NotifyPollIntervalDefault (1s) with
	// WakeupNotify.
	PollInterval time.Duration
	// Lease is how long a claim holds its rows. A row whose start was not recorded in
	// that time may be claimed again. Defaults to 30s.
	Lease time.Duration
	// StartConcurrency is the number of workflow starts in flight. Defaults to 16.
	StartConcurrency int
	// EagerStart asks Temporal to hand each new run's first workflow task straight back to
	// a worker in this process (one round trip less per message). It helps only when the
	// relay's client also runs the worker of TaskQueue, as in outbox dev.
	EagerStart bool
	// StartTimeout bounds one workflow start. Defaults to 10s.
	StartTimeout time.Duration
	// NoSearchAttributes turns off the OutboxTopic, OutboxStatus and OutboxMessageId
	// search attributes.
	NoSearchAttributes bool
	// Policy returns a topic's delivery policy. Defaults to the built-in policy.
	Policy func(topic string) workflows.Policy
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics records claims, starts and their failures. Nil records nothing.
	Metrics *metrics.Metrics
	// SweepInterval is how often the relay unparks held-back rows that nothing holds back
	// any more, which also picks up a change of a topic's ordering settings and a row
	// parked by a claim that raced its topic's resume. Defaults to 1m.
	SweepInterval time.Duration
	// Ordering are the per-topic ordering settings of the claim. The zero value hands
	// each key's messages over one at a time in commit order, and a dead message blocks
	// its key until it is redriven or discarded. Its MaxInFlight is set from
	// MaxInFlightPerTopic.
	Ordering store.OrderingRules
	// MaxInFlightPerTopic is the most messages of one topic handed to Temporal and not
	// yet sent or dead-lettered at once. The claim leaves a topic's rows beyond it in the
	// table, parked at no cost to the claim, and hands them over oldest first as the
	// topic's messages finish, so a topic with a backlog (thousands of rows committed at
	// once, or a downstream that keeps failing) is not claimed and started ahead of the
	// other topics' later messages. Keyed messages count but are not held by it (their
	// key lets one through at a time), nor are topics of the batch lane without a limit of
	// their own. Ordering.TopicMaxInFlight sets a topic's own. Defaults to
	// DefaultMaxInFlightPerTopic; -1 sets no limit.
	MaxInFlightPerTopic int
}

// Wakeup is how a relay learns of new rows.
type Wakeup string

// Wake-up modes.
const (
	// WakeupPoll claims every PollInterval.
	WakeupPoll Wakeup = "poll"
	// WakeupNotify claims on every notification of the table's NOTIFY trigger, and every
	// PollInterval.
	WakeupNotify Wakeup = "notify"
)

// Relay defaults: what a zero Config field becomes.
const (
	DefaultBatchSize          = 100
	PollIntervalDefault       = 50 * time.Millisecond // with WakeupPoll
	NotifyPollIntervalDefault = time.Second           // with WakeupNotify
	DefaultLease              = 30 * time.Second
	DefaultStartConcurrency   = 16
	DefaultStartTimeout       = 10 * time.Second
	DefaultSweepInterval      = time.Minute
	// DefaultMaxInFlightPerTopic is measured (docs/benchmarks.md): below a claim's batch
	// (DefaultBatchSize), so that a backlog is parked at once rather than claimed a batch
	// at a time ahead of the other topics, and enough for about 400 messages a second of
	// one topic whose deliveries take 50ms.
	DefaultMaxInFlightPerTopic = 20
	// LimitPollInterval is how often, at the longest, the relay claims while messages
	// wait for room under their topic's MaxInFlightPerTopic, whatever PollInterval is:
	// nothing wakes it when a topic's messages finish.
	LimitPollInterval = 50 * time.Millisecond
)

// Relay limits: Validate refuses values outside them.
const (
	MaxBatchSize        = 10000
	MinPollInterval     = 10 * time.Millisecond
	MinLease            = time.Second
	MaxStartConcurrency = 1000
	MinSweepInterval    = 10 * time.Millisecond
)

// A FieldError names the Config (or ReconcilerConfig) field whose value is not allowed,
// and says what is. The YAML configuration maps Field to its key.
type FieldError struct {
	Field   string // the Go field name, such as "BatchSize"
	Problem string // such as "must be between 1 and 10000, got 0"
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

func fieldError(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.TaskQueue = cmp.Or(c.TaskQueue, workflows.DefaultTaskQueue)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Wakeup = cmp.Or(c.Wakeup, WakeupPoll)
	if c.Wakeup == WakeupNotify {
		c.PollInterval = cmp.Or(c.PollInterval, NotifyPollIntervalDefault)
	}
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.StartConcurrency = cmp.Or(c.StartConcurrency, DefaultStartConcurrency)
	c.StartTimeout = cmp.Or(c.StartTimeout, DefaultStartTimeout)
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	c.MaxInFlightPerTopic = cmp.Or(c.MaxInFlightPerTopic, DefaultMaxInFlightPerTopic)
	c.Ordering.MaxInFlight = max(c.MaxInFlightPerTopic, 0)
	if c.Policy == nil {
		c.Policy = func(string) workflows.Policy { return workflows.Policy{} }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c (after WithDefaults). It returns every field that is not allowed, each
// as a *FieldError, joined.
func (c Config) Validate() error {
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fieldError("BatchSize", "must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize))
	}
	if c.Wakeup != WakeupPoll && c.Wakeup != WakeupNotify {
		errs = append(errs, fieldError("Wakeup", "must be %q or %q, got %q", WakeupPoll, WakeupNotify, c.Wakeup))
	}
	if c.PollInterval < MinPollInterval {
		errs = append(errs, fieldError("PollInterval", "must be at least %s, got %s", MinPollInterval, c.PollInterval))
	}
	if c.Lease < MinLease {
		errs = append(errs, fieldError("Lease", "must be at least %s, got %s", MinLease, c.Lease))
	}
	if c.StartConcurrency < 1 || c.StartConcurrency > MaxStartConcurrency {
		errs = append(errs, fieldError("StartConcurrency", "must be between 1 and %d, got %d", MaxStartConcurrency, c.StartConcurrency))
	}
	if c.StartTimeout <= 0 {
		errs = append(errs, fieldError("StartTimeout", "must be positive, got %s", c.StartTimeout))
	}
	if c.MaxInFlightPerTopic < -1 {
		errs = append(errs, fieldError("MaxInFlightPerTopic", "must be at least 1, or -1 for no limit, got %d", c.MaxInFlightPerTopic))
	}
	if c.SweepInterval < MinSweepInterval {
		errs = append(errs, fieldError("SweepInterval", "must be at least %s, got %s", MinSweepInterval, c.SweepInterval))
	}
	if c.Policy != nil {
		// The policy of the topics without one of their own, as the config file's
		// default entry is checked; each run's policy comes from it or from a topic's.
		if err := workflows.ResolvePolicy(c.Policy(""), nil).Validate(); err != nil {
			errs = append(errs, fieldError("Policy", "the policy of a topic without one of its own: %v", err))
		}
	}
	return errors.Join(errs...)
}

// Starter starts workflows; client.Client satisfies it.
type Starter interface {
	ExecuteWorkflow(ctx context.Context, options client.StartWorkflowOptions, workflow any, args ...any) (client.WorkflowRun, error)
	DescribeWorkflowExecution(ctx context.Context, workflowID, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error)
}

// Relay hands committed outbox rows to Temporal.
type Relay struct {
	cfg    Config
	store  store.Delivery
	pool   *pgxpool.Pool
	client Starter
	log    *slog.Logger

	// refused counts the consecutive passes in which Temporal refused every start;
	// lastRefusal is the error of the latest, and refusedAt its time; lasting counts the
	// consecutive ones whose refusal will not heal without an operator (see
	// lastingRefusal).
	mu          sync.Mutex
	refused     int
	lastRefusal error
	refusedAt   time.Time
	lasting     int

	// deployment is the store's deployment ID, which every workflow's input carries; set
	// by prepare once the task queue checks passed.
	deployment string
	// version is the OutboxDelivery version the relay starts: workflows.DeliveryVersion,
	// or an older one while workers of an older outbox poll the task queue (see
	// refreshVersion).
	version atomic.Int32
	// nexusHeld is set once the relay has said that Nexus topics wait for a worker of an
	// early version to go (see handOver).
	nexusHeld atomic.Bool
	// rules are the claim's rules: Config.Ordering, and a limit of none for each topic of
	// the batch lane that a claim found at its limit (see unlimitBatchTopics).
	rules atomic.Pointer[store.OrderingRules]
	// limitWaiting is set while the latest claim found rows parked for their topic's
	// limit of messages in flight (store.ClaimResult.Waiting): Run claims again within
	// LimitPollInterval, to hand them over as the topics' messages finish.
	limitWaiting atomic.Bool

	// held are the claimed rows of the batch lane waiting for their batch, by topic.
	batchMu sync.Mutex
	held    map[string]*heldBatch
	// batches are the batch starts in flight, at most StartConcurrency at once (startSem).
	batches  sync.WaitGroup
	startSem chan struct{}
	// batchesHeldBack is set once the relay logged that an older worker keeps the batch
	// lane off.
	batchesHeldBack atomic.Bool
	// handing is, while Run runs, the context the starts of its hand-overs run under (see
	// handContext).
	handing atomic.Pointer[context.Context]
}

// StopGrace is how long a stopping relay (Run's context ended) goes on handing over the
// rows it claimed: the starts under way may finish, and rows not started by then are
// left to the next claim. Temporal answers a start in milliseconds, so a claim is handed
// over well within it; a Temporal that hangs cannot hold the shutdown, and with it
// `outbox run`'s worker, which stops after the relay, beyond the grace.
const StopGrace = 3 * time.Second

// handContext is the context the starts of a hand-over run under: not cancelled with
// ctx, so a shutdown does not abandon a claim's rows to their lease, but, under Run,
// cancelled StopGrace after Run's context ended.
func (r *Relay) handContext(ctx context.Context) context.Context {
	if h := r.handing.Load(); h != nil {
		return *h
	}
	return context.WithoutCancel(ctx)
}

// lastingPasses is how many consecutive passes Temporal must refuse every start, for a
// reason that will not heal by itself, before Run gives up and returns the error.
const lastingPasses = 3

// lastingRefusal reports whether Temporal refused a start for a reason that waiting will
// not cure: the caller may not start workflows, the namespace does not exist, or the
// search attributes the start sets are not registered.
func lastingRefusal(err error) bool {
	var denied *serviceerror.PermissionDenied
	var noNamespace *serviceerror.NamespaceNotFound
	var invalid *serviceerror.InvalidArgument
	switch {
	case errors.As(err, &denied), errors.As(err, &noNamespace):
		return true
	case errors.As(err, &invalid):
		return strings.Contains(strings.ToLower(invalid.Message), "search attribute")
	}
	return false
}

// New returns a relay that claims rows through st, listens for notifications on a
// connection from pool (with WakeupNotify, when st is a store.Notifier; pool may be nil for
// a database without notifications, and the relay polls), and starts workflows with c.
func New(st store.Delivery, pool *pgxpool.Pool, c Starter, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	r := &Relay{cfg: cfg, store: st, pool: pool, client: c, log: cfg.Logger, startSem: make(chan struct{}, cfg.StartConcurrency)}
	r.rules.Store(&cfg.Ordering)
	r.version.Store(workflows.DeliveryVersion)
	return r, nil
}

// VersionCheckInterval is how often a running relay asks which OutboxDelivery version the
// workers polling its task queue run (see refreshVersion).
const VersionCheckInterval = time.Minute

// refreshVersion sets the OutboxDelivery version the relay starts to the newest one every
// outbox worker of its deployment polling the task queue runs (deployment.DeliveryVersion):
// during a rolling upgrade, runs started at a version an older worker does not run could
// have their first workflow task run the older way, which the newer workers then cannot
// replay. When the task queue cannot be described, the version stays as it was.
func (r *Relay) refreshVersion(ctx context.Context) {
	d, ok := r.client.(deployment.Describer)
	if !ok {
		return
	}
	id, err := uuid.Parse(r.deploymentID())
	if err != nil {
		return
	}
	descCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, oldest, err := deployment.DeliveryVersion(descCtx, d, r.cfg.TaskQueue, id, workflows.DeliveryVersion)
	if err != nil {
		if ctx.Err() == nil {
			r.log.DebugContext(ctx, "Cannot tell which delivery version the workers run; keeping the current one", slog.Int("version", int(r.version.Load())), slog.Any("error", err))
		}
		return
	}
	if was := int(r.version.Swap(int32(v))); was != v {
		if v < workflows.DeliveryVersion {
			r.log.WarnContext(ctx, "A worker of an older outbox polls the task queue: deliveries start at its workflow version until it is gone (upgrade workers before relays)",
				slog.Int("version", v), slog.Int("newest", workflows.DeliveryVersion), slog.String("worker", oldest))
		} else {
			r.log.InfoContext(ctx, "Every worker on the task queue runs the newest delivery version", slog.Int("version", v))
		}
	}
}

// versionLoop calls refreshVersion every VersionCheckInterval until ctx ends.
func (r *Relay) versionLoop(ctx context.Context) {
	t := time.NewTicker(VersionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if r.deploymentID() != "" {
				r.refreshVersion(ctx)
			}
		}
	}
}

// StartsRefused returns the latest error while Temporal refuses every workflow start
// (a wrong API key, a missing namespace or search attribute), and nil otherwise. The
// readiness check reports it.
func (r *Relay) StartsRefused() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused == 0 {
		return nil
	}
	return r.lastRefusal
}

// refusalBackoff is the wait before the next claim after n consecutive passes in which
// Temporal refused every start: 1s, doubling, at most 5m.
func refusalBackoff(n int) time.Duration {
	return min(time.Second<<min(n-1, 9), 5*time.Minute)
}

// sweepLoop unparks, every SweepInterval, the held-back rows that nothing holds back
// any more (see store.Store.Unpark).
func (r *Relay) sweepLoop(ctx context.Context, wake chan<- struct{}) {
	t := time.NewTicker(r.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.store.Unpark(ctx, *r.rules.Load())
		switch {
		case err != nil && !errors.Is(err, context.Canceled):
			r.log.WarnContext(ctx, "Cannot unpark held-back messages", slog.Any("error", err))
		case n > 0:
			r.log.InfoContext(ctx, "Unparked held-back messages that neither their key nor a pause holds any more", slog.Int64("messages", n))
			notify(wake)
		}
	}
}

// Run relays rows until ctx is cancelled, then finishes the batch in hand, within
// StopGrace (rows not started by then are left to the next claim), and returns nil. When
// Temporal refuses every start of three passes in a row for a reason that waiting will
// not cure (permission denied, no such namespace, search attributes not registered), Run
// returns that error instead; the claimed rows are handed over by the next relay after
// their lease.
//
// Run first checks the task queue (see prepare) and returns the error when the task queue
// is not this database's, workers of another outbox deployment poll it, or the database
// answers that the outbox's migrations have not run on it (store.ErrNotMigrated).
//
// It claims every PollInterval, and with WakeupNotify on every notification too. When a
// pending message has a "deliver not before" time ahead (next_retry_at, see
// store.Message's DeliverAfter), it also wakes when the earliest such message falls due,
// so delayed messages are handed over on time without polling faster.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.prepare(ctx); err != nil {
		if stopsRelay(err) {
			r.log.ErrorContext(ctx, "The relay does not start", slog.Any("error", err))
			return err
		}
		// The database did not answer: each pass tries again before it claims.
		r.log.WarnContext(ctx, "Cannot read the outbox deployment yet; the relay checks again before each claim", slog.Any("error", err))
	}
	// The hand-overs go on for StopGrace after ctx ends.
	handing, stopHanding := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHanding()
	graceAfter := context.AfterFunc(ctx, func() { time.AfterFunc(StopGrace, stopHanding) })
	defer graceAfter()
	r.handing.Store(&handing)
	defer r.handing.Store(nil)
	// However Run returns, the batches waiting for more rows start first (their rows
	// would otherwise wait for their lease), and the batch starts in flight end.
	defer r.batches.Wait()
	defer r.flushBatches(handing, true)
	// The background loops stop when Run returns, whichever way it does.
	ctx, stop := context.WithCancel(ctx)
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	r.startBackground(ctx, &wg, wake)
	r.log.InfoContext(ctx, "Relay started", slog.String("task_queue", r.cfg.TaskQueue), slog.String("deployment", r.deploymentID()),
		slog.Int("delivery_version", int(r.version.Load())), slog.String("wakeup", string(r.cfg.Wakeup)),
		slog.String("channel", r.channel()), slog.Duration("poll_interval", r.cfg.PollInterval))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			r.log.InfoContext(context.WithoutCancel(ctx), "Relay stopped")
			return nil
		case <-wake:
		case <-timer.C:
		}
		// Ask for the next due time before claiming: a message that falls due while the
		// claims run is then either taken by them or counted in the wait, never missed.
		asked := time.Now()
		due, delayed := r.nextDue(ctx)
		if err := r.drainDue(ctx); err != nil {
			r.log.ErrorContext(ctx, "The relay stops", slog.Any("error", err))
			return err
		}
		if err := r.gaveUp(); err != nil {
			r.log.ErrorContext(ctx, "Temporal keeps refusing every workflow start; the relay stops", slog.Any("error", err))
			return err
		}
		sleep := r.cfg.PollInterval
		if delayed {
			sleep = min(max(due-time.Since(asked), minWake), r.cfg.PollInterval)
		}
		if wait, ok := r.nextBatchDue(); ok {
			sleep = min(sleep, max(wait, minWake))
		}
		if r.limitWaiting.Load() {
			sleep = min(sleep, LimitPollInterval)
		}
		if n := r.refusedPasses(); n > 0 {
			// Temporal refuses every start: claiming again sooner only re-tries the
			// backlog. Notifications do not cut the wait short.
			if !sleepCtx(ctx, refusalBackoff(n)) {
				continue
			}
			drain(wake)
			sleep = 0
		}
		resetTimer(timer, sleep)
	}
}

// startBackground starts, in wg, what runs beside the claims: the listener (with
// WakeupNotify) and the sweep for parked rows.
func (r *Relay) startBackground(ctx context.Context, wg *sync.WaitGroup, wake chan<- struct{}) {
	n, canNotify := r.store.(store.Notifier)
	if r.cfg.Wakeup == WakeupNotify && (!canNotify || r.pool == nil) {
		r.log.InfoContext(ctx, "The database sends no notifications of new rows: the relay polls every poll_interval",
			slog.String("database", r.store.Kind()), slog.Duration("poll_interval", r.cfg.PollInterval))
	}
	if r.cfg.Wakeup == WakeupNotify && canNotify && r.pool != nil {
		if on, err := n.NotifyEnabled(ctx); err == nil && !on {
			r.log.WarnContext(ctx, "relay.wakeup is notify, but the NOTIFY trigger of the table is off: no notification will come, the relay polls every poll_interval; run outbox migrate with relay.wakeup: notify to turn it on",
				slog.Duration("poll_interval", r.cfg.PollInterval))
		}
		wg.Go(func() { r.listen(ctx, n.Channel(), wake) })
	}
	wg.Go(func() { r.sweepLoop(ctx, wake) })
	wg.Go(func() { r.versionLoop(ctx) })
}

// stopsRelay reports whether err is one that waiting does not cure: a task queue that is
// not this database's, or that another deployment's workers poll, or a database without
// the outbox's migrations. Claiming again would only log it every poll interval, while
// the relay looked healthy.
func stopsRelay(err error) bool {
	var tqErr *deployment.TaskQueueError
	var conflict *deployment.ConflictError
	return errors.As(err, &tqErr) || errors.As(err, &conflict) || errors.Is(err, store.ErrNotMigrated)
}

// drainDue claims and hands over the batches that are due: a full batch means more may be
// waiting. It returns an error stopsRelay names (found once the database answered, after
// a start without it); Run stops on it.
func (r *Relay) drainDue(ctx context.Context) error {
	for ctx.Err() == nil {
		n, err := r.runOnce(ctx)
		if stopsRelay(err) {
			return err
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.ErrorContext(ctx, "Relay pass failed", slog.Any("error", err))
		}
		if err != nil || n < r.cfg.BatchSize {
			return nil
		}
	}
	return nil
}

// RunOnce claims one batch and hands each row to Temporal. It returns the number of rows
// claimed. Once claimed, the batch is handed over even if ctx is cancelled meanwhile, so
// a shutdown does not leave rows waiting for their lease to expire.
//
// Rows of a topic of the batch lane (Policy.Batch) wait in the relay for their batch to
// fill, or for the topic's batch wait, and are then handed to one OutboxBatch run per
// batch; a row that may have been sent before (MayHaveBeenSent) gets a run of its own, as
// in the message lane.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	n, err := r.runOnce(ctx)
	// The batches still waiting for more rows start now too.
	r.flushBatches(context.WithoutCancel(ctx), true)
	r.batches.Wait()
	return n, err
}

// runOnce is RunOnce without waiting for the starts of the batches it hands over, so the
// next claim runs while they start (each marks its rows dispatched once it started).
func (r *Relay) runOnce(ctx context.Context) (int, error) {
	if err := r.prepare(ctx); err != nil {
		return 0, err
	}
	began := time.Now()
	r.relimitTopics()
	claimCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	claim, err := r.store.ClaimBatch(claimCtx, r.cfg.BatchSize, r.cfg.Lease, *r.rules.Load())
	cancel()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			r.cfg.Metrics.Error(metrics.OpClaim)
		}
		if len(claim.Claimed) == 0 {
			r.flushBatches(context.WithoutCancel(ctx), false)
			return 0, err
		}
		// The claim committed and a step after it failed (the parking of a full topic's
		// rows, or the second look at the rows it parked): the rows it claimed are handed
		// over now rather than after their lease, and the error is the pass's.
	}
	r.limitWaiting.Store(claim.Waiting)
	r.unlimitBatchTopics(claim.Full)
	rows, batched, policies := r.lanes(ctx, claim.Claimed)
	r.hold(batched, policies, began)
	p := r.newPass(ctx, began)
	p.handOver(rows, nil)
	g := r.newStartGroup(ctx)
	due := r.dueBatches(false)
	for _, b := range due {
		g.start(b)
	}
	g.close()
	p.finish()
	if len(claim.Claimed) == 0 && len(due) == 0 && err == nil {
		r.noteIdle(ctx)
	}
	if n := len(claim.Claimed); n > 0 {
		r.cfg.Metrics.Batch(n, time.Since(began))
	}
	return len(claim.Claimed) + claim.Parked, err
}

// pass is the hand-over of one claim: the starts it runs at once (StartConcurrency), and
// the rows a running workflow now owns, which it marks dispatched in one statement.
type pass struct {
	r        *Relay
	ctx      context.Context // the caller's, for logs
	hand     context.Context // the starts': not cancelled with ctx (handContext)
	leaseEnd time.Time
	sem      chan struct{}
	wg       sync.WaitGroup

	attempted, refused atomic.Int32
	firstRefusal       atomic.Pointer[error]
	mu                 sync.Mutex
	dispatched         []store.Claimed
}

func (r *Relay) newPass(ctx context.Context, began time.Time) *pass {
	return &pass{
		r: r, ctx: ctx, hand: r.handContext(ctx),
		// Rows whose lease is about to run out by this process's clock are left to the
		// next claim: starting them now would race another relay that may already have
		// taken them.
		leaseEnd: began.Add(r.cfg.Lease - min(r.cfg.StartTimeout, r.cfg.Lease/2)),
		sem:      make(chan struct{}, r.cfg.StartConcurrency),
	}
}

// handOver starts a delivery run of its own for each row; checkFirst, when not nil, says
// for which rows the run asks check-processed before it sends (by default those that
// MayHaveBeenSent).
func (p *pass) handOver(rows []store.Claimed, checkFirst func(store.Claimed) bool) {
	if len(rows) == 0 {
		return
	}
	r := p.r
	messages := r.teamMessages(p.ctx, rows)
	for _, row := range byTopicTurns(rows) {
		p.sem <- struct{}{}
		if time.Now().After(p.leaseEnd) {
			<-p.sem
			r.log.InfoContext(p.ctx, "Lease running out before the start; leaving the row for the next claim",
				slog.String("message_id", row.MessageID.String()))
			continue
		}
		if p.hand.Err() != nil {
			<-p.sem
			r.log.InfoContext(p.ctx, "The relay stopped before the start; leaving the row for the next claim",
				slog.String("message_id", row.MessageID.String()))
			continue
		}
		p.wg.Add(1)
		go func() {
			defer func() { <-p.sem; p.wg.Done() }()
			// One deadline for the whole hand-over: the start, then the row update or the
			// describe, so a stuck connection cannot stall the relay.
			rowCtx, cancel := context.WithTimeout(p.hand, r.cfg.StartTimeout+20*time.Second)
			defer cancel()
			var msg *store.Row
			if m, ok := messages[row.MessageID]; ok {
				msg = &m
			}
			check := row.MayHaveBeenSent()
			if checkFirst != nil {
				check = checkFirst(row)
			}
			owned, err := r.handOver(rowCtx, row, msg, check)
			if errors.Is(err, errHeld) {
				return
			}
			if err == nil || p.hand.Err() == nil {
				// A start cut short by the relay's stop is no refusal of Temporal's.
				p.note(err)
			}
			if owned {
				p.own(row)
			}
		}()
	}
}

// unlimitBatchTopics lifts the limit of messages in flight from those of topics that are
// of the batch lane (Policy.Batch) and have no limit of their own in Config.Ordering: a
// batch gathers up to its size of claimed rows, which the limit would cut to it. The next
// claim puts their parked rows back.
func (r *Relay) unlimitBatchTopics(topics []string) {
	rules := *r.rules.Load()
	var lift []string
	for _, t := range topics {
		if _, own := rules.TopicMaxInFlight[t]; !own && r.batchLane(t) {
			lift = append(lift, t)
		}
	}
	if len(lift) == 0 {
		return
	}
	limits := maps.Clone(rules.TopicMaxInFlight)
	if limits == nil {
		limits = map[string]int{}
	}
	for _, t := range lift {
		limits[t] = -1
	}
	rules.TopicMaxInFlight = limits
	r.rules.Store(&rules)
}

// relimitTopics puts the limit of messages in flight back on the topics whose limit
// unlimitBatchTopics lifted and whose rows are no longer delivered in batches (the topic's
// policy dropped the batch lane, or a worker without it polls the task queue): their rows
// start a run each again, which the limit bounds.
func (r *Relay) relimitTopics() {
	rules := *r.rules.Load()
	var back []string
	for t, n := range rules.TopicMaxInFlight {
		if _, own := r.cfg.Ordering.TopicMaxInFlight[t]; n == -1 && !own && !r.batchLane(t) {
			back = append(back, t)
		}
	}
	if len(back) == 0 {
		return
	}
	limits := maps.Clone(rules.TopicMaxInFlight)
	for _, t := range back {
		delete(limits, t)
	}
	rules.TopicMaxInFlight = limits
	r.rules.Store(&rules)
}

// batchLane reports whether the topic's claimed rows go to batches now (see lanes).
func (r *Relay) batchLane(topic string) bool {
	return r.cfg.Policy(topic).Batch != nil && r.version.Load() >= workflows.BatchVersion
}

// byTopicTurns returns rows in the order their topics take turns: the first row of each
// topic, then the second of each, and so on, each topic's rows in their order. A pass that
// hands over part of one topic's backlog then starts the other topics' rows in its first
// round of starts, not behind the backlog.
func byTopicTurns(rows []store.Claimed) []store.Claimed {
	turn := make(map[string]int)
	turns := make([]int, len(rows))
	for i, row := range rows {
		turns[i] = turn[row.Topic]
		turn[row.Topic]++
	}
	if len(turn) < 2 {
		return rows
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(turns[a], turns[b]) })
	out := make([]store.Claimed, len(rows))
	for i, j := range order {
		out[i] = rows[j]
	}
	return out
}

// note counts one start and its refusal.
func (p *pass) note(err error) {
	p.attempted.Add(1)
	if err != nil {
		p.refused.Add(1)
		p.firstRefusal.CompareAndSwap(nil, &err)
	}
}

// own adds rows that a running workflow now owns: each its own run, so no batch (a row a
// batch had before keeps no batch ID once its own run has it; reconciliation would
// otherwise look at that batch for it).
func (p *pass) own(rows ...store.Claimed) {
	p.mu.Lock()
	for _, row := range rows {
		row.Batch = ""
		p.dispatched = append(p.dispatched, row)
	}
	p.mu.Unlock()
}

// finish waits for the pass's starts, marks the owned rows dispatched and records how
// the starts went.
func (p *pass) finish() {
	p.wg.Wait()
	// The runs started own their rows, also after StopGrace.
	p.r.markDispatched(context.WithoutCancel(p.hand), p.dispatched)
	p.r.noteStarts(p.ctx, int(p.attempted.Load()), int(p.refused.Load()), p.firstRefusal.Load())
}

// noteStarts records how a pass's starts went. A pass in which Temporal refused every
// start puts the relay in backoff (and not-ready); any start that succeeds ends it, and
// so does noteIdle. The refusals of a pass are logged as one line.
func (r *Relay) noteStarts(ctx context.Context, attempted, refused int, first *error) {
	if attempted == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if refused < attempted {
		if r.refused > 0 {
			r.log.InfoContext(ctx, "Temporal accepts workflow starts again", slog.Int("passes_refused", r.refused))
		}
		r.refused, r.lastRefusal, r.lasting = 0, nil, 0
		if refused > 0 {
			r.log.WarnContext(ctx, "Some workflow starts failed; their rows are retried after the lease",
				slog.Int("failed", refused), slog.Int("attempted", attempted), slog.Any("error", *first))
		}
		return
	}
	r.refused, r.refusedAt = r.refused+1, time.Now()
	r.lastRefusal = fmt.Errorf("temporal refused all %d workflow starts of the last pass: %w", attempted, *first)
	if lastingRefusal(*first) {
		r.lasting++
	} else {
		r.lasting = 0
	}
	r.log.WarnContext(ctx, "Temporal refused every workflow start of this pass; backing off",
		slog.Int("refused", refused), slog.Int("passes", r.refused), slog.Duration("next_pass_in", refusalBackoff(r.refused)),
		slog.Any("error", *first))
}

// noteIdle records a pass that claimed nothing and had no batch to start. Once the refused
// rows' lease has run out, it ends the refusals: another relay started those rows, or none
// is left, and nothing says that Temporal still refuses.
func (r *Relay) noteIdle(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused > 0 && time.Since(r.refusedAt) > r.cfg.Lease {
		r.log.InfoContext(ctx, "Nothing to start since the refused rows' lease ran out; no longer backing off", slog.Int("passes_refused", r.refused))
		r.refused, r.lastRefusal, r.lasting = 0, nil, 0
	}
}

// gaveUp returns the refusal Run stops with: Temporal refused every start of the last
// lastingPasses passes for a reason that will not heal.
func (r *Relay) gaveUp() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lasting < lastingPasses {
		return nil
	}
	return fmt.Errorf("relay stopped: %w (after %d passes; this does not heal by waiting: check the API key's permissions, the namespace and the search attributes)", r.lastRefusal, r.lasting)
}

func (r *Relay) refusedPasses() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

// sleepCtx sleeps for d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// drain empties a wake-up channel.
func drain(wake <-chan struct{}) {
	select {
	case <-wake:
	default:
	}
}

// prepare checks, once, that the relay starts workflows where its outbox's workers are: it
// records the task queue on the store's deployment when none is recorded yet, refuses a
// task queue other than the recorded one, and refuses to start while workers of another
// outbox deployment poll the task queue (a task queue belongs to one outbox database).
// It keeps the deployment ID for the workflows' inputs.
func (r *Relay) prepare(ctx context.Context) error {
	if r.deploymentID() != "" {
		return nil
	}
	id, recorded, err := r.store.RecordTaskQueue(ctx, r.cfg.TaskQueue)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if recorded != r.cfg.TaskQueue {
		return fmt.Errorf("relay: %w", &deployment.TaskQueueError{Schema: r.store.Schema(), Configured: r.cfg.TaskQueue, Recorded: recorded})
	}
	if d, ok := r.client.(deployment.Describer); ok {
		descCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := deployment.CheckTaskQueue(descCtx, d, r.cfg.TaskQueue, id)
		cancel()
		var conflict *deployment.ConflictError
		switch {
		case errors.As(err, &conflict):
			return fmt.Errorf("relay: %w", err)
		case err != nil:
			r.log.WarnContext(ctx, "Cannot tell whether another outbox deployment polls the task queue; starting without that check",
				slog.String("task_queue", r.cfg.TaskQueue), slog.Any("error", err))
		}
	}
	r.mu.Lock()
	r.deployment = id.String()
	r.mu.Unlock()
	r.refreshVersion(ctx)
	return nil
}

func (r *Relay) deploymentID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deployment
}

// teamMessages reads, in one statement, the claimed rows of topics delivered by a team's
// activity, workflow or Nexus operation, whose run gives the message to it: the input
// then carries it (DeliveryInput.Message) and the run needs no load step. Rows
// handed over before are left out (their run reads the row, to learn whether an earlier
// run delivered it), and so are payloads over the store's limit or too large for
// Temporal once encoded, and headers over store.MaxHeadersBytes (their run's load
// dead-letters them with the reason: a start carrying them could be refused for its size,
// again at every claim). When the read fails, every run loads its message.
func (r *Relay) teamMessages(ctx context.Context, rows []store.Claimed) map[uuid.UUID]store.Row {
	var ids []uuid.UUID
	for _, row := range rows {
		if r.cfg.Policy(row.Topic).DeliveredByTeam() && !row.MayHaveBeenSent() {
			ids = append(ids, row.MessageID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	all, err := r.store.GetAll(readCtx, ids)
	if err != nil {
		r.log.WarnContext(ctx, "Cannot read the messages of team topics with the claim; their runs load them", slog.Int("messages", len(ids)), slog.Any("error", err))
		return nil
	}
	for id, m := range all {
		compact, encoded := store.PayloadSizes(m.Payload)
		if compact > r.store.MaxPayloadBytes() || encoded > store.HardMaxPayloadBytes || store.HeadersSize(m.Headers) > store.MaxHeadersBytes {
			delete(all, id)
		}
	}
	return all
}

// StartOptions returns the options a message's workflow is started with.
func (r *Relay) StartOptions(in workflows.DeliveryInput) client.StartWorkflowOptions {
	opts := client.StartWorkflowOptions{
		ID:                    workflows.WorkflowID(in.MessageID),
		TaskQueue:             r.cfg.TaskQueue,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		// A running delivery is never replaced; a start that meets one fails with
		// WorkflowExecutionAlreadyStarted, which the relay treats as handed over.
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		StaticSummary:                            fmt.Sprintf("outbox %s %s", in.Topic, in.MessageID),
		EnableEagerStart:                         r.cfg.EagerStart,
	}
	if in.SearchAttributes {
		opts.TypedSearchAttributes = workflows.StartSearchAttributes(in)
	}
	if in.LocalFirstAttempt() {
		// The first attempt runs as a local activity inside the first workflow task,
		// which must outlast it.
		opts.WorkflowTaskTimeout = workflows.FirstTaskTimeout(in.Policy.SendTimeout)
	}
	return opts
}

// errHeld is what handOver returns for a row it did not try to start (a Nexus topic's,
// while a worker of an early version polls): no start, so neither an accepted one nor a
// refusal of Temporal's.
var errHeld = errors.New("held back from its start")

// handOver starts the row's workflow. It reports whether a running workflow now owns the
// row (the caller marks such rows dispatched, a pass at a time), and returns the error of
// a start that Temporal refused (the row stays claimed and is retried after its lease),
// or errHeld for a row it did not start.
//
// msg, when not nil, is the row's message for a team topic's input (see teamMessages);
// checkFirst makes the run ask check-processed before it sends.
func (r *Relay) handOver(ctx context.Context, row store.Claimed, msg *store.Row, checkFirst bool) (owned bool, err error) {
	log := r.log.With(slog.String("message_id", row.MessageID.String()), slog.String("topic", row.Topic))
	policy := workflows.ResolvePolicy(r.cfg.Policy(row.Topic), row.MaxRetryTimes)
	policy.Batch = nil               // a run of its own
	version := int(r.version.Load()) // once: a refresh between two reads must not mix them
	in := workflows.DeliveryInput{
		MessageID:        row.MessageID.String(),
		Topic:            row.Topic,
		Policy:           policy,
		SearchAttributes: !r.cfg.NoSearchAttributes,
		CheckFirst:       checkFirst,
		Version:          version,
		Deployment:       r.deploymentID(),
	}
	if policy.Nexus != nil {
		// A worker of an older version would not know the Nexus operation: it leaves a
		// run of this version to a newer worker. A worker from before that guard would
		// run it as a sink's topic, which no newer worker could replay: while one polls,
		// the row waits for it to go (it is claimed again after the lease).
		if version < workflows.GuardVersion {
			if !r.nexusHeld.Swap(true) {
				log.WarnContext(ctx, "A worker of an early version polls the task queue: the messages of Nexus topics wait until it is upgraded",
					slog.Int("worker_version", version), slog.Int("needed", workflows.GuardVersion))
			}
			return false, errHeld
		}
		in.Version = max(in.Version, workflows.NexusVersion)
	}
	if msg != nil {
		in.Message = &dmsg.Message{MessageID: row.MessageID.String(), Topic: msg.Topic, Payload: msg.Payload, Headers: msg.Headers, CreatedAt: msg.CreatedAt}
		if msg.OrderingKey != nil {
			in.OrderingKey = *msg.OrderingKey
			in.Message.OrderingKey = *msg.OrderingKey
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	_, err = r.client.ExecuteWorkflow(startCtx, r.StartOptions(in), workflows.WorkflowType, in)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	switch {
	case err == nil:
		r.cfg.Metrics.WorkflowStarted()
		if row.RedriveCount > 0 {
			r.cfg.Metrics.Redriven(row.Topic)
		}
		return true, nil
	case errors.As(err, &started):
		r.cfg.Metrics.WorkflowAlreadyStarted()
		return r.alreadyStarted(ctx, log, row, started.RunId), nil
	default:
		r.cfg.Metrics.Error(metrics.OpStartWorkflow)
		// The row stays claimed; another pass takes it when the lease expires. The pass
		// logs its refusals in one line.
		log.DebugContext(ctx, "Cannot start delivery workflow; will retry after the lease",
			slog.Time("lease_until", row.LeaseUntil), slog.Any("error", err))
		return false, err
	}
}

// markDispatched records the rows of a pass that a running workflow owns, in one
// statement. A row that moved on meanwhile (its workflow already finished, or its lease
// expired and another relay took it) is left as it is.
func (r *Relay) markDispatched(ctx context.Context, rows []store.Claimed) {
	if len(rows) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := r.store.MarkDispatchedAll(ctx, rows)
	switch {
	case err != nil:
		r.cfg.Metrics.Error(metrics.OpMarkDispatched)
		r.log.WarnContext(ctx, "Workflows started but their rows were not marked dispatched; they are handed over again after the lease",
			slog.Int("rows", len(rows)), slog.Any("error", err))
	case n < len(rows):
		r.log.DebugContext(ctx, "Some rows moved on before they were marked dispatched", slog.Int("rows", len(rows)), slog.Int("marked", n))
	}
}

// alreadyStarted handles a start that met an existing run of the message's workflow: a
// running (or paused) one owns the message (owned is true), unless it is a run that
// dead-lettered the message and is closing, which a redrive raced: the row is then
// claimed again in ClosingRunRetry, to start the new run once that one has failed. A
// completed run delivered the message.
func (r *Relay) alreadyStarted(ctx context.Context, log *slog.Logger, row store.Claimed, runID string) (owned bool) {
	id := workflows.WorkflowID(row.MessageID.String())
	desc, err := r.client.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		r.cfg.Metrics.Error(metrics.OpDescribeWorkflow)
		log.WarnContext(ctx, "Workflow already started but cannot be described", slog.String("run_id", runID), slog.Any("error", err))
		return false
	}
	status := desc.GetWorkflowExecutionInfo().GetStatus()
	switch status {
	case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED:
		// A paused run is open, and goes on once unpaused. The run described is the
		// workflow's current one, which may be newer than the one the start met.
		current := cmp.Or(desc.GetWorkflowExecutionInfo().GetExecution().GetRunId(), runID)
		closing, err := r.deadLettering(ctx, row.MessageID, current)
		switch {
		case err != nil:
			// Whether the run delivers the message is unknown: it does not get the row.
			r.cfg.Metrics.Error(metrics.OpDeadLetterRuns)
			log.WarnContext(ctx, "Workflow already running, but whether it dead-lettered the message cannot be read; will retry after the lease",
				slog.String("run_id", current), slog.Any("error", err))
			return false
		case closing:
			r.retrySoon(ctx, log, row, current)
			return false
		}
		log.InfoContext(ctx, "Workflow already running; handed over", slog.String("run_id", current))
		return true
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		sent, err := r.store.RecordSent(ctx, row.MessageID)
		if err != nil {
			r.cfg.Metrics.Error(metrics.OpMarkSent)
			log.WarnContext(ctx, "Cannot record the completed run's outcome", slog.Any("error", err))
			return false
		}
		if sent != nil {
			// The run delivered it and could not record it, so no worker counted it.
			r.cfg.Metrics.Sent(sent.Topic, sent.Latency)
		}
		log.InfoContext(ctx, "Workflow already completed; row recorded as sent", slog.String("run_id", runID), slog.Bool("changed", sent != nil))
	default:
		// A run that closed any other way allows a new start, so this raced a run that was
		// closing (a dead letter, most likely, which has moved the row on). A row still
		// claimed when its lease expires is claimed and started again.
		log.InfoContext(ctx, "Workflow start rejected by a run that was closing", slog.String("status", status.String()))
		// It has closed now: the next claim starts the new run, without waiting the lease.
		r.retrySoon(ctx, log, row, desc.GetWorkflowExecutionInfo().GetExecution().GetRunId())
	}
	return false
}

// ClosingRunRetry is how soon a row is claimed again when its start met the run that
// dead-lettered it, redriven before that run closed.
const ClosingRunRetry = time.Second

// deadLettering reports whether runID is a run that dead-lettered the message. Such a run
// is closing: dead-lettering is its last step, after which it fails. It does not deliver
// the message, so when the message has been redriven meanwhile it must not be taken for
// the message's owner.
func (r *Relay) deadLettering(ctx context.Context, messageID uuid.UUID, runID string) (bool, error) {
	runs, err := r.store.DeadLetterRunIDs(ctx, messageID)
	if err != nil {
		return false, err
	}
	return slices.Contains(runs, runID), nil
}

// retrySoon leaves a redriven row whose start met the run that dead-lettered it claimed,
// with a lease that ends after ClosingRunRetry: the run closes (failed) within moments,
// and a start after that begins the new run the redrive asked for (the reuse policy
// allows a new run after a failed one). Marking the row dispatched instead would leave it
// with no run once the closing one has failed, until reconciliation.
func (r *Relay) retrySoon(ctx context.Context, log *slog.Logger, row store.Claimed, runID string) {
	ok, err := r.store.RetryClaimAfter(ctx, row.ID, row.ClaimToken, ClosingRunRetry)
	switch {
	case err != nil:
		r.cfg.Metrics.Error(metrics.OpRetryClaim)
		log.WarnContext(ctx, "The run that dead-lettered the message is still closing, and its row cannot be set to be claimed again soon; will retry after the lease",
			slog.String("run_id", runID), slog.Any("error", err))
	case ok:
		log.InfoContext(ctx, "The run that dead-lettered the message is still closing; starting the redriven message's new run shortly",
			slog.String("run_id", runID), slog.Duration("retry_in", ClosingRunRetry))
	default:
		log.DebugContext(ctx, "Row moved on before it was set to be claimed again soon")
	}
}

// listen forwards the table's notifications to wake until ctx is cancelled, reconnecting
// after a failure. Polling goes on without it.
func (r *Relay) listen(ctx context.Context, channel string, wake chan<- struct{}) {
	backoff := time.Second
	for ctx.Err() == nil {
		listened, err := r.listenOnce(ctx, channel, wake)
		if ctx.Err() != nil {
			return
		}
		if listened {
			backoff = time.Second
		}
		r.log.WarnContext(ctx, "LISTEN connection lost; polling meanwhile", slog.Any("error", err), slog.Duration("retry_in", backoff))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (r *Relay) listenOnce(ctx context.Context, channel string, wake chan<- struct{}) (listened bool, err error) {
	// A connection of its own, outside the pool: it is held for as long as the relay runs.
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return false, err
	}
	// Rows committed before LISTEN took effect sent their notification to nobody: look once.
	notify(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		notify(wake)
	}
}

// channel is the NOTIFY channel of the relay's store, which it listens on with
// WakeupNotify; "" when its database has none.
func (r *Relay) channel() string {
	if n, ok := r.store.(store.Notifier); ok {
		return n.Channel()
	}
	return ""
}

func notify(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// minWake is the shortest sleep between two passes of Run, so that a message falling due
// during a pass costs one more pass, not a burst of them.
const minWake = 10 * time.Millisecond

// nextDue returns how long it is until the earliest delayed message falls due, by the
// database clock; ok is false when no message is waiting for its time, or when that
// cannot be read (logged): Run then sleeps for PollInterval, and a notification or the
// poll still brings it round.
func (r *Relay) nextDue(ctx context.Context) (wait time.Duration, ok bool) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wait, ok, err := r.store.NextDue(qctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "Cannot read when the next delayed message is due; waking at the poll interval",
				slog.Duration("poll_interval", r.cfg.PollInterval), slog.Any("error", err))
		}
		return 0, false
	}
	return wait, ok
}

// resetTimer makes t fire once after d, whether or not it has fired or been read.
func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

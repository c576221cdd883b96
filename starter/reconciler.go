package starter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// Reconciler defaults.
const (
	ReconcileAfterDefault       = 5 * time.Minute
	ReconcileIntervalDefault    = time.Minute
	ReconcileBatchSizeDefault   = 100
	ReconcileConcurrencyDefault = 16
)

// Reconciler limits.
const (
	MinReconcileAfter    = time.Second
	MinReconcileInterval = 10 * time.Millisecond
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// After is how long a row may stay dispatched without change before the reconciler
	// asks Temporal about its workflow. Defaults to ReconcileAfterDefault (5m).
	After time.Duration
	// Interval is how often Run looks for such rows. Defaults to
	// ReconcileIntervalDefault (1m).
	Interval time.Duration
	// BatchSize is the number of rows one pass takes. Each Interval, Run takes one batch,
	// and more while the batches come back full and mostly repaired (a mass failure):
	// rows whose workflows are running are looked at no faster than a batch an interval.
	// Defaults to ReconcileBatchSizeDefault (100).
	BatchSize int
	// Concurrency is the number of DescribeWorkflowExecution calls in flight. Defaults to
	// ReconcileConcurrencyDefault (16).
	Concurrency int
	// DescribeTimeout bounds one describe and its repair. Defaults to 10s.
	DescribeTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics counts repairs and describe failures. Nil records nothing.
	Metrics *metrics.Metrics
	// OnPass, when set, is called after each pass with what it did; tests wait on it.
	OnPass func(ReconcileResult)
}

// WithDefaults returns c with every zero field set to its default.
func (c ReconcilerConfig) WithDefaults() ReconcilerConfig {
	c.After = cmp.Or(c.After, ReconcileAfterDefault)
	c.Interval = cmp.Or(c.Interval, ReconcileIntervalDefault)
	c.BatchSize = cmp.Or(c.BatchSize, ReconcileBatchSizeDefault)
	c.Concurrency = cmp.Or(c.Concurrency, ReconcileConcurrencyDefault)
	c.DescribeTimeout = cmp.Or(c.DescribeTimeout, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c (after WithDefaults) and returns the first field that is not allowed
// as a *FieldError.
func (c ReconcilerConfig) Validate() error {
	switch {
	case c.After < MinReconcileAfter:
		return fieldError("After", "must be at least %s, got %s", MinReconcileAfter, c.After)
	case c.Interval < MinReconcileInterval:
		return fieldError("Interval", "must be at least %s, got %s", MinReconcileInterval, c.Interval)
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return fieldError("BatchSize", "must be between 1 and 10000, got %d", c.BatchSize)
	case c.Concurrency < 1 || c.Concurrency > 256:
		return fieldError("Concurrency", "must be between 1 and 256, got %d", c.Concurrency)
	case c.DescribeTimeout <= 0:
		return fieldError("DescribeTimeout", "must be positive, got %s", c.DescribeTimeout)
	}
	return nil
}

// Describer reads a workflow's state; client.Client satisfies it.
type Describer interface {
	DescribeWorkflowExecution(ctx context.Context, workflowID, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error)
}

// Reconciler keeps dispatched rows agreeing with Temporal. Row state in PostgreSQL is the
// source of truth, but a workflow can go missing (namespace reset, retention expired,
// history lost), close without recording its outcome, or complete while the database was
// unreachable. The reconciler takes rows that have been dispatched without change for
// longer than After, asks Temporal about each one's workflow (DescribeWorkflowExecution,
// not the eventually consistent visibility list) and repairs those whose workflow cannot
// finish them: completed → recorded sent; missing, or closed any other way → pending, so
// a relay starts a new run. Every repair is logged, counted and audited.
//
// It runs beside the relay: app.RunRelay (and so outbox relay) runs one with each relay;
// a relay wired by hand runs its own with Run. Several reconcilers share the work: each
// pass claims its rows with SKIP LOCKED and touches them, so no two look at the same row.
type Reconciler struct {
	cfg    ReconcilerConfig
	store  store.Delivery
	client Describer
}

// NewReconciler returns a reconciler of st's rows that asks c about their workflows.
func NewReconciler(st store.Delivery, c Describer, cfg ReconcilerConfig) (*Reconciler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("reconciler config: %w", err)
	}
	return &Reconciler{cfg: cfg, store: st, client: c}, nil
}

// ReconcileResult is what one pass did.
type ReconcileResult struct {
	// Examined counts the rows the pass looked at.
	Examined int
	// Repaired counts the rows it repaired, by outcome.
	Repaired map[store.ReconcileOutcome]int
	// Failed counts the rows whose workflow could not be described or repaired; they
	// are looked at again after After.
	Failed int
}

// Total returns the number of rows repaired.
func (r ReconcileResult) Total() int {
	n := 0
	for _, v := range r.Repaired {
		n += v
	}
	return n
}

// Run reconciles every Interval until ctx is cancelled: one batch, and further batches
// while they come back full and at least half repaired. It returns nil when ctx is
// cancelled.
func (rc *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(rc.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for ctx.Err() == nil {
			res, err := rc.RunOnce(ctx)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					rc.cfg.Logger.WarnContext(ctx, "Reconciliation pass failed", slog.Any("error", err))
				}
				break
			}
			if res.Examined < rc.cfg.BatchSize || res.Total()*2 < res.Examined {
				break
			}
		}
	}
}

// reconcileClaimTimeout bounds a pass's claim of stale dispatched rows.
const reconcileClaimTimeout = 30 * time.Second

// RunOnce takes one batch of stale dispatched rows and repairs those whose workflow
// cannot finish them, Concurrency at a time.
func (rc *Reconciler) RunOnce(ctx context.Context) (ReconcileResult, error) {
	res := ReconcileResult{Repaired: map[store.ReconcileOutcome]int{}}
	// A database that stops answering mid-query (a connection half open) fails the pass,
	// which the next one retries, instead of stopping reconciliation without a word.
	claimCtx, cancel := context.WithTimeout(ctx, reconcileClaimTimeout)
	rows, err := rc.store.ClaimStaleDispatched(claimCtx, rc.cfg.After, rc.cfg.BatchSize)
	cancel()
	if err != nil {
		return res, err
	}
	res.Examined = len(rows)
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, rc.cfg.Concurrency)
	)
	for _, d := range rows {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			outcome, ok := rc.reconcileRow(ctx, d)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case !ok:
				res.Failed++
			case outcome != "":
				res.Repaired[outcome]++
			}
		}()
	}
	wg.Wait()
	if rc.cfg.OnPass != nil {
		rc.cfg.OnPass(res)
	}
	return res, ctx.Err()
}

// reconcileRow looks at one row's workflow and repairs the row when it must. It returns
// the repair's outcome ("" when none was needed or the row moved on) and false when the
// workflow could not be described or the row repaired.
func (rc *Reconciler) reconcileRow(ctx context.Context, d store.Dispatched) (store.ReconcileOutcome, bool) {
	ctx, cancel := context.WithTimeout(ctx, rc.cfg.DescribeTimeout)
	defer cancel()
	log := rc.cfg.Logger.With(slog.String("message_id", d.MessageID.String()), slog.String("topic", d.Topic))
	outcome, detail, err := rc.workflowOutcome(ctx, d)
	if err != nil {
		rc.cfg.Metrics.Error(metrics.OpDescribeWorkflow)
		log.WarnContext(ctx, "Cannot reconcile a dispatched row", slog.Any("error", err))
		return "", false
	}
	if outcome == store.ReconcileRunning {
		return "", true // the claim touched it: the next look is After from now
	}
	ok, err := rc.store.Repair(ctx, d, outcome, detail)
	if err != nil {
		log.WarnContext(ctx, "Cannot repair a dispatched row", slog.Any("error", err))
		return "", false
	}
	if !ok {
		return "", true
	}
	rc.cfg.Metrics.Reconciled(string(outcome))
	if outcome == store.ReconcileRecordedSent {
		// Delivered by a run that could not record it (the worker never counted it): a
		// message sent, whose commit-to-sent time this pass does not read.
		rc.cfg.Metrics.Sent(d.Topic, -1)
	}
	log.WarnContext(ctx, "Reconciled a dispatched row", slog.String("outcome", string(outcome)), slog.String("workflow", detail))
	return outcome, true
}

// workflowOutcome says what the message's workflow means for its dispatched row.
func (rc *Reconciler) workflowOutcome(ctx context.Context, d store.Dispatched) (outcome store.ReconcileOutcome, detail string, err error) {
	id := workflows.WorkflowID(d.MessageID.String())
	desc, err := rc.client.DescribeWorkflowExecution(ctx, id, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound) && d.BatchID != nil:
		// The row was handed to a batch, and has no run of its own: the batch has it.
		return rc.batchOutcome(ctx, d, *d.BatchID)
	case errors.As(err, &notFound):
		return store.ReconcileHandedOverAgain, "workflow " + id + " not found", nil
	case err != nil:
		return "", "", err
	}
	info := desc.GetWorkflowExecutionInfo()
	detail = fmt.Sprintf("workflow %s run %s is %s", id, info.GetExecution().GetRunId(), info.GetStatus())
	switch info.GetStatus() {
	case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED:
		// A paused run is open: it goes on where it stopped once an operator unpauses it.
		return store.ReconcileRunning, detail, nil
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return store.ReconcileRecordedSent, detail, nil
	default:
		// Terminated, cancelled, timed out, or failed without dead-lettering (a failed
		// run dead-letters the row before it fails): nothing will deliver it.
		return store.ReconcileHandedOverAgain, detail, nil
	}
}

// ResultReader reads a closed run's result; client.Client satisfies it. A reconciler whose
// client has it reads a completed batch's result to learn whether the batch delivered a
// row it left dispatched.
type ResultReader interface {
	GetWorkflow(ctx context.Context, workflowID, runID string) client.WorkflowRun
}

// batchOutcome says what the batch run a row was handed to means for the row: running (or
// paused), it still has the row; completed, it delivered the row when its result says so
// (a batch that could not record its delivered rows sent), and otherwise it handed the
// row to a run that no longer exists or could not start one; closed any other way, or
// missing, nothing will deliver it.
func (rc *Reconciler) batchOutcome(ctx context.Context, d store.Dispatched, batch string) (store.ReconcileOutcome, string, error) {
	desc, err := rc.client.DescribeWorkflowExecution(ctx, batch, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return store.ReconcileHandedOverAgain, "batch " + batch + " not found, nor workflow " + workflows.WorkflowID(d.MessageID.String()), nil
	case err != nil:
		return "", "", err
	}
	info := desc.GetWorkflowExecutionInfo()
	detail := fmt.Sprintf("batch %s run %s is %s", batch, info.GetExecution().GetRunId(), info.GetStatus())
	switch info.GetStatus() {
	case enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED:
		return store.ReconcileRunning, detail, nil
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
	default:
		return store.ReconcileHandedOverAgain, detail, nil
	}
	rr, ok := rc.client.(ResultReader)
	if !ok {
		return store.ReconcileHandedOverAgain, detail + "; its result cannot be read here", nil
	}
	var res workflows.BatchResult
	if err := rr.GetWorkflow(ctx, batch, info.GetExecution().GetRunId()).Get(ctx, &res); err != nil {
		return "", "", fmt.Errorf("read the result of batch %s: %w", batch, err)
	}
	for _, o := range res.Outcomes {
		if o.MessageID != d.MessageID.String() {
			continue
		}
		detail += ", and the message's outcome in it is " + string(o.Outcome)
		if o.Outcome == workflows.BatchSent || o.Outcome == workflows.BatchAlreadySent {
			return store.ReconcileRecordedSent, detail, nil
		}
		return store.ReconcileHandedOverAgain, detail, nil
	}
	return store.ReconcileHandedOverAgain, detail + ", and the message is not in it", nil
}

package workflows

import (
	"cmp"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Names of the retention workflow, its activity and its schedule.
const (
	// RetentionWorkflowType is the registered name of the retention workflow.
	RetentionWorkflowType = "OutboxRetention"
	// RetentionScheduleID is the ID of the Temporal Schedule that runs retention for the
	// outbox on the default task queue; RetentionScheduleFor names the schedule of any.
	RetentionScheduleID = "outbox-retention"
	// RetentionWorkflowID is the ID the default task queue's schedule gives the workflows
	// it starts (the server appends the scheduled time); RetentionScheduleFor names it
	// for any task queue.
	RetentionWorkflowID = "outbox-retention"
	// ActivityPurgeBatch is the activity that removes one batch of old rows.
	ActivityPurgeBatch = "OutboxPurgeBatch"

	// DefaultRetentionMaxBatches caps the batches of one retention run.
	DefaultRetentionMaxBatches = 1000
	// ErrTypeInvalidRetention is the type of the error a retention run fails with when its
	// input is out of range.
	ErrTypeInvalidRetention = "OutboxInvalidRetention"
)

// RetentionScheduleFor returns the ID of the Temporal Schedule that runs retention for the
// outbox whose task queue is taskQueue, which is also the ID the schedule gives the
// workflows it starts: RetentionScheduleID for the default task queue, and
// outbox-retention-<task queue> for another. A task queue belongs to one outbox database,
// and several of them may share a namespace, each with its own schedule.
func RetentionScheduleFor(taskQueue string) string {
	if taskQueue == "" || taskQueue == DefaultTaskQueue {
		return RetentionScheduleID
	}
	return RetentionScheduleID + "-" + taskQueue
}

// RetentionInput is the input of OutboxRetention, and of each OutboxPurgeBatch activity
// it runs.
type RetentionInput struct {
	// SentAfter is the age (since sent_at) after which sent messages are removed.
	SentAfter time.Duration `json:"sent_after"`
	// DiscardedAfter is the age after which discarded messages and their dead letters
	// are removed.
	DiscardedAfter time.Duration `json:"discarded_after"`
	// Archive moves the rows to the archive tables instead of deleting them.
	Archive bool `json:"archive"`
	// BatchSize is the number of rows one activity (one short transaction) removes.
	BatchSize int `json:"batch_size"`
	// MaxBatches caps the batches of one run. A run that reaches it continues as new with
	// the same input, so a large backlog is worked off without a long history. Defaults
	// to DefaultRetentionMaxBatches (1000).
	MaxBatches int `json:"max_batches,omitempty"`
	// Previous is what the earlier runs of a continued-as-new chain removed. Set by the
	// workflow itself.
	Previous *RetentionResult `json:"previous,omitempty"`
}

// Validate reports the first field of in that is out of range.
func (in RetentionInput) Validate() error {
	switch {
	case in.SentAfter <= 0:
		return fmt.Errorf("sent_after must be positive, got %s", in.SentAfter)
	case in.DiscardedAfter <= 0:
		return fmt.Errorf("discarded_after must be positive, got %s", in.DiscardedAfter)
	case in.BatchSize < 1:
		return fmt.Errorf("batch_size must be at least 1, got %d", in.BatchSize)
	case in.MaxBatches < 0:
		return fmt.Errorf("max_batches must not be negative, got %d", in.MaxBatches)
	}
	return nil
}

// PurgeBatchResult is the result of one OutboxPurgeBatch activity: the rows it removed.
type PurgeBatchResult struct {
	SentMessages      int64 `json:"sent_messages"`
	DiscardedMessages int64 `json:"discarded_messages"`
	DeadLetters       int64 `json:"dead_letters"`
	// More is true when the batch removed BatchSize rows, so more may be due.
	More bool `json:"more"`
}

// RetentionResult is the result of OutboxRetention: what it removed, over all the runs of
// its continue-as-new chain.
type RetentionResult struct {
	Batches           int   `json:"batches"`
	SentMessages      int64 `json:"sent_messages"`
	DiscardedMessages int64 `json:"discarded_messages"`
	DeadLetters       int64 `json:"dead_letters"`
	// Runs is the number of runs of the chain, this one included.
	Runs int `json:"runs"`
}

// purgeActivityOptions run one batch: a short transaction, retried a few times (the
// database may be restarting); after that the run fails, visibly in the UI, and the
// schedule's next run tries again.
var purgeActivityOptions = workflow.ActivityOptions{
	StartToCloseTimeout: 10 * time.Minute,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumInterval:    time.Minute,
		MaximumAttempts:    5,
	},
}

// Retention is the OutboxRetention workflow: it runs OutboxPurgeBatch, one batch (one
// short transaction) per activity, until a batch removes fewer rows than BatchSize. After
// MaxBatches batches it continues as new with the same input and the counts so far, so
// each run's history stays small however large the backlog.
func Retention(ctx workflow.Context, in RetentionInput) (RetentionResult, error) {
	if err := in.Validate(); err != nil {
		return RetentionResult{}, temporal.NewNonRetryableApplicationError("invalid retention input: "+err.Error(), ErrTypeInvalidRetention, nil)
	}
	var total RetentionResult
	if in.Previous != nil {
		total = *in.Previous
	}
	total.Runs++
	batch := in
	batch.MaxBatches, batch.Previous = 0, nil
	actx := workflow.WithActivityOptions(ctx, purgeActivityOptions)
	logger := workflow.GetLogger(ctx)

	for range cmp.Or(in.MaxBatches, DefaultRetentionMaxBatches) {
		var res PurgeBatchResult
		if err := workflow.ExecuteActivity(actx, ActivityPurgeBatch, batch).Get(ctx, &res); err != nil {
			return total, fmt.Errorf("purge batch %d: %w", total.Batches+1, err)
		}
		total.Batches++
		total.SentMessages += res.SentMessages
		total.DiscardedMessages += res.DiscardedMessages
		total.DeadLetters += res.DeadLetters
		if !res.More {
			logger.Info("Retention done", "batches", total.Batches, "sent_messages", total.SentMessages,
				"discarded_messages", total.DiscardedMessages, "dead_letters", total.DeadLetters, "archive", in.Archive)
			return total, nil
		}
	}
	logger.Info("Retention continues as new", "batches", total.Batches, "sent_messages", total.SentMessages)
	next := in
	next.Previous = &total
	return RetentionResult{}, workflow.NewContinueAsNewError(ctx, RetentionWorkflowType, next)
}

// RetentionRegisterOptions returns the options Retention is registered with.
func RetentionRegisterOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: RetentionWorkflowType}
}

package workflows

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// The batch lane: a topic whose Policy.Batch is set has its rows handed over in batches,
// each batch to one OutboxBatch run. The run sends the batch's messages with one activity
// (a broker's batch publish, or the topic's handler for each message, several at once),
// which records the delivered ones sent as they are delivered; every message the batch could
// not deliver leaves it for an OutboxDelivery run of its own (outbox-<message_id>, as in
// the message lane), started by the batch run as an abandoned child, which carries on
// from the batch's attempt: the backoff, the retries, check-processed and the dead letter.
// So a message delivered at once costs its share of the batch (2 actions for the whole
// batch: the start, and the send as a local activity of its first workflow task, or as a
// regular activity), and every message that needed a retry has a history of its own.
const (
	// BatchWorkflowType is the registered name of the batch workflow.
	BatchWorkflowType = "OutboxBatch"
	// BatchWorkflowIDPrefix starts every batch workflow ID:
	// outbox-batch-<the batch's first message ID>.
	BatchWorkflowIDPrefix = "outbox-batch-"
	// ActivitySendBatch sends a batch's messages.
	ActivitySendBatch = "OutboxSendBatch"
	// ActivityMarkSentAll records a batch's delivered messages sent, when the send could
	// not.
	ActivityMarkSentAll = "OutboxMarkSentAll"
)

// BatchWorkflowID returns the workflow ID of a batch whose first message is messageID.
func BatchWorkflowID(messageID string) string { return BatchWorkflowIDPrefix + messageID }

// BatchPolicy is a topic's batch lane: its rows are handed over Size at a time, a batch
// waits at most Wait for more rows, and a handler without a batch publish
// (delivery.BatchHandler) is called for Concurrency messages at once.
type BatchPolicy struct {
	// Size is the most messages of one batch. Defaults to 100.
	Size int `json:"size"`
	// Wait is the longest a claimed row waits for its batch to fill. Defaults to 200ms.
	Wait time.Duration `json:"wait"`
	// Concurrency is how many messages of a batch a handler without a batch publish
	// sends at once (the http sink: concurrent requests). Defaults to 16.
	Concurrency int `json:"concurrency"`
}

// Batch defaults and limits.
const (
	DefaultBatchSize        = 100
	DefaultBatchWait        = 200 * time.Millisecond
	DefaultBatchConcurrency = 16
	MaxBatchSize            = 1000
	MaxBatchWait            = 10 * time.Second
	MaxBatchConcurrency     = 256
)

// WithDefaults fills the zero fields of b.
func (b BatchPolicy) WithDefaults() BatchPolicy {
	b.Size = cmp.Or(b.Size, DefaultBatchSize)
	b.Wait = cmp.Or(b.Wait, DefaultBatchWait)
	b.Concurrency = cmp.Or(b.Concurrency, DefaultBatchConcurrency)
	return b
}

// Validate reports the first field of b that is out of range.
func (b BatchPolicy) Validate() error {
	switch {
	case b.Size < 1 || b.Size > MaxBatchSize:
		return fmt.Errorf("batch.size must be between 1 and %d, got %d", MaxBatchSize, b.Size)
	case b.Wait < 0 || b.Wait > MaxBatchWait:
		return fmt.Errorf("batch.wait must be between 0s and %s, got %s", MaxBatchWait, b.Wait)
	case b.Concurrency < 1 || b.Concurrency > MaxBatchConcurrency:
		return fmt.Errorf("batch.concurrency must be between 1 and %d, got %d", MaxBatchConcurrency, b.Concurrency)
	}
	return nil
}

// BatchInput is the input of OutboxBatch: references to its messages, not their payloads
// (the send activity loads them), and the topic's policy, resolved by the relay.
type BatchInput struct {
	Topic    string         `json:"topic"`
	Messages []BatchMessage `json:"messages"`
	// Policy is the topic's policy (Batch set), which each message's own run takes with
	// the message's MaxRetryTimes if the message leaves the batch.
	Policy Policy `json:"policy"`
	// SearchAttributes says whether the runs keep the outbox's search attributes.
	SearchAttributes bool `json:"search_attributes"`
	// Version is the version the relay starts (DeliveryVersion, 5 or later), which the
	// messages' own runs get too.
	Version int `json:"version"`
	// Deployment is DeliveryInput.Deployment.
	Deployment string `json:"deployment,omitempty"`
}

// BatchMessage is one message of a batch.
type BatchMessage struct {
	MessageID string `json:"message_id"`
	// MaxRetryTimes is the row's max_retry_times, for the policy of the message's own run.
	MaxRetryTimes *int `json:"max_retry_times,omitempty"`
	// ClaimToken is the token of the claim that handed the message to the batch: the batch
	// takes the row only while that claim holds it, so a row claimed again meanwhile is
	// left to the new claim's hand-over. Empty in a batch started by a relay of an earlier
	// release.
	ClaimToken string `json:"claim_token,omitempty"`
}

// SendBatchInput is the input of the send-batch activity.
type SendBatchInput struct {
	// Batch is the batch's workflow ID, which its rows name (batch_id): the activity
	// sends only those rows, and rows no batch has taken yet.
	Batch    string         `json:"batch"`
	Topic    string         `json:"topic"`
	Messages []BatchMessage `json:"messages"`
	// MaxAttempts is the topic's, for the messages' Attempt and MaxAttempts.
	MaxAttempts int `json:"max_attempts"`
	// Concurrency and SendTimeout bound the sends of a handler without a batch publish.
	Concurrency int           `json:"concurrency"`
	SendTimeout time.Duration `json:"send_timeout"`
	Deployment  string        `json:"deployment,omitempty"`
}

// BatchOutcomeKind is what happened to one message of a batch.
type BatchOutcomeKind string

// Batch outcomes.
const (
	// BatchSent: the batch delivered the message.
	BatchSent BatchOutcomeKind = "sent"
	// BatchAlreadySent: an earlier run had delivered it; it was not sent again.
	BatchAlreadySent BatchOutcomeKind = "already_sent"
	// BatchSkipped: the message was not the batch's to send (another batch holds it, or
	// it is dead, discarded or gone); Note says why.
	BatchSkipped BatchOutcomeKind = "skipped"
	// BatchFailed: the send failed (Error, ErrType); the batch hands the message over.
	BatchFailed BatchOutcomeKind = "failed"
	// BatchHandedOver: the message left the batch for a run of its own (Run).
	BatchHandedOver BatchOutcomeKind = "handed_over"
	// BatchHandOverFailed: that run could not be started; the row stays with the batch,
	// and reconciliation hands it over again.
	BatchHandOverFailed BatchOutcomeKind = "hand_over_failed"
)

// BatchOutcome is what one message of a batch came to; the batch's history lists one per
// message, without payloads.
type BatchOutcome struct {
	MessageID string           `json:"message_id"`
	Outcome   BatchOutcomeKind `json:"outcome"`
	// Recorded says that a delivered message's row is recorded sent.
	Recorded bool `json:"recorded,omitempty"`
	// Error, ErrType and RetryAfter are a failed send's (ErrType as the send activity's
	// errors: ErrTypePermanent, ErrTypeRetryable, ErrTypeAmbiguous, ErrTypeUnknownTopic).
	Error      string        `json:"error,omitempty"`
	ErrType    string        `json:"error_type,omitempty"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Note says why a message was skipped, or why its hand-over failed.
	Note string `json:"note,omitempty"`
	// Run is the run ID of the message's own run, once handed over ("" when the message
	// had a run already).
	Run string `json:"run,omitempty"`
}

// SendBatchResult is the result of the send-batch activity: one outcome per message, in
// the order of the input.
type SendBatchResult struct {
	Outcomes []BatchOutcome `json:"outcomes"`
}

// MarkSentAllInput is the input of the mark-sent-all activity.
type MarkSentAllInput struct {
	MessageIDs []string `json:"message_ids"`
}

// BatchResult is the result of OutboxBatch: what each message came to, and the counts.
type BatchResult struct {
	Outcomes   []BatchOutcome `json:"outcomes"`
	Sent       int            `json:"sent"`
	HandedOver int            `json:"handed_over"`
	// Unrecorded counts delivered messages whose rows could not be recorded sent within
	// MarkSentTimeout: reconciliation records them from this result.
	Unrecorded int `json:"unrecorded,omitempty"`
}

// PriorAttempt is the attempt a batch made of a message before the message left it for a
// run of its own (DeliveryInput.Prior): the run goes on from it.
type PriorAttempt struct {
	// Attempts is the number of attempts made (1: the batch's).
	Attempts   int           `json:"attempts"`
	Error      string        `json:"error"`
	ErrType    string        `json:"error_type"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Batch is the workflow ID of the batch run that made it.
	Batch string `json:"batch"`
}

// BatchHeartbeatTimeout is how long the send-batch activity may go without a heartbeat
// before Temporal takes its worker for lost; it heartbeats every BatchHeartbeatInterval.
const (
	BatchHeartbeatTimeout  = 20 * time.Second
	BatchHeartbeatInterval = 5 * time.Second
)

// batchSendTimeout bounds the send-batch activity: the batch's sends share the policy's
// SendTimeout (a message whose turn comes later is not sent), and the loading and
// recording around them.
func batchSendTimeout(p Policy) time.Duration { return p.SendTimeout + 10*time.Second }

// LocalSend reports whether the batch sends as a local activity in its first workflow
// task, as a message's first attempt does (Policy.LocalFirstAttempt: a sink topic, its
// first attempt local, a timeout of at most MaxLocalSendTimeout): the run then completes
// in that task when every message was delivered, and dispatches no activity. The relay
// starts such a batch with the workflow task timeout BatchTaskTimeout; otherwise the send
// is a regular activity that heartbeats.
func (in BatchInput) LocalSend() bool { return in.Policy.LocalFirstAttempt() }

// BatchTaskTimeout is the workflow task timeout of a batch whose send is local: long
// enough that the task is never heartbeated while the send runs (see FirstTaskTimeout).
func BatchTaskTimeout(p Policy) time.Duration {
	return FirstTaskTimeout(batchSendTimeout(p.WithDefaults()))
}

// Batch is the OutboxBatch workflow: it sends its messages with the send-batch activity
// (a local activity in its first workflow task when the topic's first attempts are local,
// see BatchInput.LocalSend), records the delivered ones sent (the activity does, or the
// mark-sent-all step when it could not), and hands each message it could not deliver to an
// OutboxDelivery run of its own, which goes on from the batch's attempt. When the activity
// itself fails (its worker was lost, it timed out, or the first task was tried before),
// every message is handed over as after an ambiguous failure; when it found the outbox's
// database unavailable, or reached a worker of another outbox, the messages are handed
// over with no attempt used. The run completes
// with every message's outcome, those whose run could not be started included
// (BatchHandOverFailed): their rows stay with the batch, and reconciliation hands them
// over again.
func Batch(ctx workflow.Context, in BatchInput) (BatchResult, error) {
	if in.Version > DeliveryVersion {
		panic(fmt.Sprintf("batch of %d %s messages: OutboxBatch version %d was asked for, and this worker runs versions up to %d: "+
			"left for a worker that runs it (upgrade the workers before the relays)", len(in.Messages), in.Topic, in.Version, DeliveryVersion))
	}
	logger := workflow.GetLogger(ctx)
	policy := in.Policy.WithDefaults()
	batch := policy.Batch.WithDefaults()
	info := workflow.GetInfo(ctx)
	send := SendBatchInput{
		Batch: info.WorkflowExecution.ID, Topic: in.Topic, Messages: in.Messages, MaxAttempts: max(policy.MaxAttempts, 1),
		Concurrency: batch.Concurrency, SendTimeout: policy.SendTimeout, Deployment: in.Deployment,
	}
	timeout := batchSendTimeout(policy)
	var (
		res SendBatchResult
		err error
		// retried: an earlier try of the first task may have sent, and no attempt of this
		// run's is known to have happened.
		retried bool
	)
	switch local := in.LocalSend() && localSendFits(info.WorkflowTaskTimeout, timeout); {
	case local && firstTaskRetried(ctx):
		// An earlier try of this first task did not complete (its worker was lost
		// mid-send, or the task failed before the send): its local send may have reached
		// the downstream. Send nothing here; every message goes to a run of its own, which
		// checks first and then makes its first attempt, as a message's own run does
		// after a retried first task: the try that may have sent used up no attempt.
		err = errors.New("the batch's first workflow task was tried before: its send may have happened")
		retried = true
	case local:
		localCtx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout:    timeout,
			ScheduleToCloseTimeout: timeout,
			RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		err = workflow.ExecuteLocalActivity(localCtx, ActivitySendBatch, send).Get(ctx, &res)
	default:
		sendCtx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: timeout,
			// The send heartbeats while it runs: a batch whose worker was lost is noticed
			// within this, not at the end of its send timeout.
			HeartbeatTimeout: BatchHeartbeatTimeout,
			RetryPolicy:      &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		err = workflow.ExecuteActivity(sendCtx, ActivitySendBatch, send).Get(ctx, &res)
	}
	outcomes := make([]BatchOutcome, len(in.Messages))
	if err != nil {
		// Nothing is known of any message: each goes to a run of its own, which checks
		// before it sends again, unless nothing can have been sent.
		f := failure{message: err.Error(), ambiguous: true}
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) && (appErr.Type() == ErrTypeStoreUnavailable || appErr.Type() == ErrTypeWrongDeployment) {
			f = failure{message: appErr.Message()}
		}
		logger.Warn("The batch's send failed; every message goes to a run of its own", "messages", len(in.Messages), "error", f.message)
		for i, m := range in.Messages {
			o := BatchOutcome{MessageID: m.MessageID, Outcome: BatchFailed, Error: f.message, ErrType: ErrTypeAmbiguous}
			if !f.ambiguous {
				o.ErrType = appErr.Type()
			}
			outcomes[i] = o
		}
	} else {
		byID := make(map[string]BatchOutcome, len(res.Outcomes))
		for _, o := range res.Outcomes {
			byID[o.MessageID] = o
		}
		for i, m := range in.Messages {
			o, ok := byID[m.MessageID]
			if !ok {
				o = BatchOutcome{MessageID: m.MessageID, Outcome: BatchFailed, ErrType: ErrTypeAmbiguous, Error: "the send reported nothing of this message"}
			}
			outcomes[i] = o
		}
	}

	result := BatchResult{}
	var unrecorded []string
	for _, o := range outcomes {
		if o.Outcome == BatchSent && !o.Recorded {
			unrecorded = append(unrecorded, o.MessageID)
		}
	}
	if len(unrecorded) > 0 {
		// Delivered, and not recorded: record them, within MarkSentTimeout; past it the
		// run completes and reconciliation records them from its result.
		opts := dbActivityOptions
		opts.ScheduleToCloseTimeout = policy.MarkSentTimeout
		markCtx := workflow.WithLocalActivityOptions(ctx, opts)
		err := workflow.ExecuteLocalActivity(markCtx, ActivityMarkSentAll, MarkSentAllInput{MessageIDs: unrecorded}).Get(ctx, nil)
		if err != nil {
			logger.Warn("Delivered, but the rows could not be recorded sent; reconciliation will record them", "messages", len(unrecorded), "error", err)
			result.Unrecorded = len(unrecorded)
		} else {
			for i := range outcomes {
				if outcomes[i].Outcome == BatchSent {
					outcomes[i].Recorded = true
				}
			}
		}
	}

	handOver(ctx, in, policy, outcomes, retried)
	for _, o := range outcomes {
		switch o.Outcome {
		case BatchSent:
			result.Sent++
		case BatchHandedOver:
			result.HandedOver++
		}
	}
	result.Outcomes = outcomes
	return result, nil
}

// handOver starts an OutboxDelivery run of its own for each failed message of outcomes,
// all at once, and records each start in the message's outcome. A message that has a run
// already (started by an earlier try, or by the message lane) counts as handed over. With
// retried (the batch's first task was tried before, and may have sent), each run checks
// first and goes on from no attempt (DeliveryInput.CheckFirst) instead of from the batch's.
func handOver(ctx workflow.Context, in BatchInput, policy Policy, outcomes []BatchOutcome, retried bool) {
	info := workflow.GetInfo(ctx)
	type started struct {
		i      int
		future workflow.ChildWorkflowFuture
	}
	var starts []started
	for i, o := range outcomes {
		if o.Outcome != BatchFailed {
			continue
		}
		m := in.Messages[i]
		own := ResolvePolicy(policy, m.MaxRetryTimes)
		own.Batch = nil
		din := DeliveryInput{
			MessageID: m.MessageID, Topic: in.Topic, Policy: own, SearchAttributes: in.SearchAttributes,
			Version: in.Version, Deployment: in.Deployment,
		}
		switch {
		case retried:
			din.CheckFirst = true
		case o.ErrType != ErrTypeStoreUnavailable && o.ErrType != ErrTypeWrongDeployment && o.ErrType != ErrTypeNotAttempted:
			// Nothing was sent when the database was unavailable, the worker was another
			// outbox's or the batch's time ran out first: the run starts afresh. Otherwise
			// it goes on from the batch's attempt.
			din.Prior = &PriorAttempt{Attempts: 1, Error: o.Error, ErrType: o.ErrType, RetryAfter: o.RetryAfter, Batch: info.WorkflowExecution.ID}
		}
		opts := workflow.ChildWorkflowOptions{
			WorkflowID:            WorkflowID(m.MessageID),
			TaskQueue:             info.TaskQueueName,
			ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
			StaticSummary:         fmt.Sprintf("outbox %s %s", in.Topic, m.MessageID),
		}
		if din.LocalFirstAttempt() {
			opts.WorkflowTaskTimeout = FirstTaskTimeout(own.SendTimeout)
		}
		if in.SearchAttributes {
			opts.TypedSearchAttributes = StartSearchAttributes(din)
		}
		starts = append(starts, started{i, workflow.ExecuteChildWorkflow(workflow.WithChildOptions(ctx, opts), WorkflowType, din)})
	}
	var failed int
	for _, s := range starts {
		var exec workflow.Execution
		err := s.future.GetChildWorkflowExecution().Get(ctx, &exec)
		o := &outcomes[s.i]
		switch {
		case err == nil:
			o.Outcome, o.Run = BatchHandedOver, exec.RunID
		case temporal.IsWorkflowExecutionAlreadyStartedError(err):
			o.Outcome = BatchHandedOver
		default:
			o.Outcome, o.Note = BatchHandOverFailed, err.Error()
			failed++
		}
	}
	if failed > 0 {
		workflow.GetLogger(ctx).Warn("Some messages could not be handed to runs of their own; reconciliation hands them over again", "messages", failed)
	}
}

package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Search attribute keys.
var (
	topicKey     = temporal.NewSearchAttributeKeyKeyword(SearchAttrTopic)
	statusKey    = temporal.NewSearchAttributeKeyKeyword(SearchAttrStatus)
	messageIDKey = temporal.NewSearchAttributeKeyKeyword(SearchAttrMessageID)
)

// StartSearchAttributes returns the search attributes a delivery starts with.
func StartSearchAttributes(in DeliveryInput) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		topicKey.ValueSet(in.Topic),
		statusKey.ValueSet(SearchStatusDispatched),
		messageIDKey.ValueSet(in.MessageID),
	)
}

// dbActivityOptions run the activities that only write to the outbox tables. They retry
// until they succeed: a delivered message must be recorded, a given-up one dead-lettered.
var dbActivityOptions = workflow.LocalActivityOptions{
	StartToCloseTimeout: 15 * time.Second,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumInterval:    time.Minute,
	},
}

// checkActivityOptions run check-processed: a read, tried a few times; when it cannot get
// an answer the workflow sends again (at-least-once).
var checkActivityOptions = workflow.ActivityOptions{
	StartToCloseTimeout: 30 * time.Second,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumAttempts:    3,
	},
}

// Delivery is the OutboxDelivery workflow: it sends the message until the topic's
// handler accepts it, then marks the row sent; when the attempts run out or the failure is
// permanent it dead-letters the message and fails with an ErrTypeDeadLettered error.
func Delivery(ctx workflow.Context, in DeliveryInput) (DeliveryResult, error) {
	logger := workflow.GetLogger(ctx)
	policy := in.Policy.WithDefaults()
	maxAttempts := max(policy.MaxAttempts, 1) // never 0: that would mean "unlimited"

	setStatus := func(status string) {
		if !in.SearchAttributes {
			return
		}
		if err := workflow.UpsertTypedSearchAttributes(ctx, statusKey.ValueSet(status)); err != nil {
			logger.Warn("Cannot update search attribute", SearchAttrStatus, status, "error", err)
		}
	}
	dbCtx := workflow.WithLocalActivityOptions(ctx, dbActivityOptions)
	sendCtx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: policy.SendTimeout,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	checkCtx := workflow.WithActivityOptions(ctx, checkActivityOptions)

	markSent := func(attempts int, alreadyProcessed bool) (DeliveryResult, error) {
		// Version 1 bounds mark-sent: a database that stays unreachable past
		// MarkSentTimeout no longer keeps a delivered message's run open. The run then
		// completes "delivered, not recorded", and the relay's reconciliation records the
		// row from the completed run. Runs recorded before version 1 retry forever.
		markCtx := dbCtx
		bounded := workflow.GetVersion(ctx, "mark-sent-bounded", workflow.DefaultVersion, 1) >= 1
		if bounded {
			opts := dbActivityOptions
			opts.ScheduleToCloseTimeout = policy.MarkSentTimeout
			markCtx = workflow.WithLocalActivityOptions(ctx, opts)
		}
		err := workflow.ExecuteLocalActivity(markCtx, ActivityMarkSent, MarkSentInput{MessageID: in.MessageID, Attempts: attempts}).Get(ctx, nil)
		if err != nil && !bounded {
			return DeliveryResult{}, fmt.Errorf("mark message sent: %w", err)
		}
		setStatus(SearchStatusSent)
		if err != nil {
			logger.Warn("Delivered, but the row could not be recorded sent; reconciliation will record it", "error", err)
			return DeliveryResult{Attempts: attempts, AlreadyProcessed: alreadyProcessed, Unrecorded: true}, nil
		}
		return DeliveryResult{Attempts: attempts, AlreadyProcessed: alreadyProcessed}, nil
	}

	var (
		lastErr       string
		ambiguous     bool
		checkable     = true
		attempt       int
		permanentFail bool
	)
	for attempt = 1; attempt <= maxAttempts; attempt++ {
		if ambiguous && checkable {
			var res CheckProcessedResult
			err := workflow.ExecuteActivity(checkCtx, ActivityCheckProcessed, CheckProcessedInput{MessageID: in.MessageID, Topic: in.Topic}).Get(ctx, &res)
			switch {
			case err != nil:
				logger.Warn("Check-processed failed; sending again", "error", err)
			case !res.Supported:
				checkable = false
			case res.Processed:
				return markSent(attempt-1, true)
			}
		}

		err := workflow.ExecuteActivity(sendCtx, ActivitySend, SendInput{
			MessageID: in.MessageID, Topic: in.Topic, Attempt: attempt, MaxAttempts: maxAttempts,
		}).Get(ctx, nil)
		if err == nil {
			return markSent(attempt, false)
		}

		f := classify(err)
		lastErr, ambiguous = f.message, f.ambiguous
		if f.permanent {
			permanentFail = true
			break
		}
		if attempt == maxAttempts {
			break
		}
		wait := policy.Backoff(attempt)
		if f.retryAfter > 0 {
			wait = min(f.retryAfter, policy.MaxInterval)
		}
		logger.Info("Send attempt failed; retrying", "attempt", attempt, "max_attempts", maxAttempts, "wait", wait, "error", lastErr)
		setStatus(SearchStatusRetrying)
		if err := workflow.Sleep(ctx, wait); err != nil {
			return DeliveryResult{}, err
		}
	}
	attempts := min(attempt, maxAttempts)

	reason := lastErr
	if permanentFail {
		reason = "permanent failure: " + lastErr
	} else {
		reason = fmt.Sprintf("gave up after %d attempts: %s", attempts, lastErr)
	}
	info := workflow.GetInfo(ctx)
	err := workflow.ExecuteLocalActivity(dbCtx, ActivityDeadLetter, DeadLetterInput{
		MessageID:  in.MessageID,
		Topic:      in.Topic,
		WorkflowID: info.WorkflowExecution.ID,
		RunID:      info.WorkflowExecution.RunID,
		Attempts:   attempts,
		LastError:  reason,
	}).Get(ctx, nil)
	if err != nil {
		return DeliveryResult{}, fmt.Errorf("dead-letter message: %w", err)
	}
	setStatus(SearchStatusDead)
	return DeliveryResult{}, temporal.NewNonRetryableApplicationError(
		"message dead-lettered: "+reason, ErrTypeDeadLettered, nil, attempts)
}

type failure struct {
	message    string
	permanent  bool
	ambiguous  bool
	retryAfter time.Duration
}

// classify reads a send activity's error. A timeout, a crash of the worker or any error
// the handler did not classify is ambiguous: the downstream may have the message.
func classify(err error) failure {
	var (
		appErr     *temporal.ApplicationError
		timeoutErr *temporal.TimeoutError
		panicErr   *temporal.PanicError
	)
	switch {
	case errors.As(err, &appErr):
		f := failure{message: appErr.Message(), retryAfter: appErr.NextRetryDelay()}
		switch {
		case appErr.NonRetryable() || appErr.Type() == ErrTypePermanent || appErr.Type() == ErrTypeUnknownTopic:
			f.permanent = true
		case appErr.Type() == ErrTypeRetryable:
		default:
			f.ambiguous = true
		}
		return f
	case errors.As(err, &timeoutErr):
		return failure{message: fmt.Sprintf("send timed out (%s)", timeoutErr.TimeoutType()), ambiguous: true}
	case errors.As(err, &panicErr):
		return failure{message: "send panicked: " + panicErr.Error(), ambiguous: true}
	default:
		msg := err.Error()
		if cause := errors.Unwrap(err); cause != nil {
			msg = cause.Error()
		}
		return failure{message: msg, ambiguous: true}
	}
}

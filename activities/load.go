package activities

import (
	"context"
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// LoadMessage reads a message for a topic delivered by a team's activity or workflow (see
// workflows.ActivityHandler and WorkflowHandler): the delivery.Message they get. A message that is
// not in the table, is dead or discarded, has a payload over the store's limit (a row
// inserted without Enqueue's check), or one that Temporal would refuse to carry to the
// team (see checkEncodedSize) is a permanent failure; an unavailable database is retried
// by the workflow until it answers.
func (a *Activities) LoadMessage(ctx context.Context, in workflows.LoadMessageInput) (workflows.LoadMessageResult, error) {
	row, err := a.loadRow(ctx, in.MessageID)
	if err != nil {
		return workflows.LoadMessageResult{}, err
	}
	switch row.Status {
	case store.StatusSent:
		return workflows.LoadMessageResult{AlreadySent: true}, nil
	case store.StatusDead, store.StatusDiscarded:
		return workflows.LoadMessageResult{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("message %s is %s", row.MessageID, row.Status), workflows.ErrTypePermanent, nil)
	}
	if err := checkPayloadSize(row, a.Store.MaxPayloadBytes()); err != nil {
		return workflows.LoadMessageResult{}, err
	}
	if err := checkEncodedSize(row); err != nil {
		return workflows.LoadMessageResult{}, err
	}
	m := message(row, 0, 0)
	return workflows.LoadMessageResult{Message: m, OrderingKey: m.OrderingKey, Paused: row.Paused}, nil
}

// RecordFailure records a failed attempt of a team's activity or workflow start on the
// message's row (retry_times, last_error) and counts it in the send attempt and failure
// metrics, as Send does for a sink's attempt. When the message's topic is paused it then
// fails with a non-retryable ErrTypeTopicPaused error, which tells the run to wait for
// the resume.
func (a *Activities) RecordFailure(ctx context.Context, in workflows.RecordFailureInput) error {
	id, err := parseID(in.MessageID)
	if err != nil {
		return err
	}
	if err := a.noteFailure(ctx, id, in.Topic, in.Attempt, in.Error, in.ErrType); err != nil {
		return temporal.NewApplicationError(err.Error(), workflows.ErrTypeStoreUnavailable)
	}
	// No send activity of the outbox ran the team's attempt: it is counted here, as the
	// attempt that delivers a message is counted by mark-sent (MarkSentInput.TeamAttempt).
	a.Metrics.SendAttempt(in.Topic)
	// The team's attempts do not read the topic's pause: the run learns of it here, and
	// waits for the resume before its next attempt.
	if row, err := a.Store.Get(ctx, id); err == nil && row.Paused {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("recorded; topic %q is paused (outbox topic resume %s ends the pause)", in.Topic, in.Topic), workflows.ErrTypeTopicPaused, nil)
	}
	return nil
}

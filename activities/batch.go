package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/sinks/teamactivity"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// SendBatch is a batch's attempt: it loads the batch's rows in one statement, sends the
// ones that are the batch's to send with the topic's handler (its batch publish, or one
// send per message, SendBatchInput.Concurrency at once), records the delivered ones sent
// in one statement, records each failure on its row, and returns one outcome per message.
// It fails as a whole only when nothing was sent: the outbox's database is unavailable
// (ErrTypeStoreUnavailable) or the batch is another outbox's (ErrTypeWrongDeployment).
//
// A row is the batch's to send while it is claimed or dispatched and names this batch or
// no batch (the relay records the batch when the run has started); a row sent already is
// reported so, and one that another batch holds, or that is dead, discarded, pending again
// or gone, is skipped.
func (a *Activities) SendBatch(ctx context.Context, in workflows.SendBatchInput) (workflows.SendBatchResult, error) {
	out := workflows.SendBatchResult{Outcomes: make([]workflows.BatchOutcome, len(in.Messages))}
	if len(in.Messages) == 0 {
		return out, nil
	}
	if err := a.checkDeployment(ctx, in.Messages[0].MessageID, in.Deployment); err != nil {
		return out, err
	}
	ids := make([]uuid.UUID, 0, len(in.Messages))
	for i, m := range in.Messages {
		out.Outcomes[i].MessageID = m.MessageID
		id, err := uuid.Parse(m.MessageID)
		if err != nil {
			out.Outcomes[i] = failedOutcome(m.MessageID, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("message_id must be a UUID, got %q", m.MessageID), workflows.ErrTypePermanent, nil))
			continue
		}
		ids = append(ids, id)
	}
	rows, err := a.Store.GetAll(ctx, ids)
	if err != nil {
		a.logger().WarnContext(ctx, "Cannot load the batch's messages: the outbox database is unavailable",
			slog.String("batch", in.Batch), slog.Int("messages", len(in.Messages)), slog.Any("error", err))
		return out, temporal.NewApplicationError(err.Error(), workflows.ErrTypeStoreUnavailable)
	}
	h, known := a.Handlers.Lookup(in.Topic)

	var (
		send   []delivery.Message
		sendAt []int // the outcome of each message of send
		limit  = a.Store.MaxPayloadBytes()
	)
	for i, m := range in.Messages {
		o := &out.Outcomes[i]
		if o.Outcome != "" {
			continue // not a UUID
		}
		id, _ := uuid.Parse(m.MessageID)
		row, ok := rows[id]
		switch {
		case !ok:
			*o = failedOutcome(m.MessageID, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("message %s is not in the outbox table", id), workflows.ErrTypePermanent, nil))
		case row.Status == store.StatusSent:
			o.Outcome, o.Recorded = workflows.BatchAlreadySent, true
		case row.Status != store.StatusClaimed && row.Status != store.StatusDispatched:
			o.Outcome, o.Note = workflows.BatchSkipped, fmt.Sprintf("the message is %s", row.Status)
		case row.BatchID != nil && *row.BatchID != in.Batch:
			o.Outcome, o.Note = workflows.BatchSkipped, "another batch holds the message: "+*row.BatchID
		case !known:
			*o = failedOutcome(m.MessageID, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("no handler for topic %q: add it under topics: in the config, or add a default: entry", in.Topic),
				workflows.ErrTypeUnknownTopic, nil))
		default:
			if err := checkPayloadSize(row, limit); err != nil {
				*o = failedOutcome(m.MessageID, err)
				continue
			}
			send = append(send, message(row, 1, in.MaxAttempts))
			sendAt = append(sendAt, i)
		}
	}

	errs := a.sendAll(ctx, h, rows, send, in)
	var delivered []uuid.UUID
	for j, err := range errs {
		o := &out.Outcomes[sendAt[j]]
		if err == nil {
			o.Outcome = workflows.BatchSent
			id, _ := uuid.Parse(o.MessageID)
			delivered = append(delivered, id)
			continue
		}
		if errors.Is(err, delivery.ErrConnectionLost) {
			a.Metrics.ConnectionLost(in.Topic)
		}
		*o = failedOutcome(o.MessageID, teamactivity.ApplicationError(err))
	}
	a.recordBatchSent(ctx, in, delivered, out.Outcomes)
	a.recordBatchFailures(ctx, in, out.Outcomes)
	return out, nil
}

// sendAll sends msgs with h: the handler's batch publish in one span, or one send per
// message, each in a span of its own that continues the message's trace.
func (a *Activities) sendAll(ctx context.Context, h delivery.Handler, rows map[uuid.UUID]store.Row, msgs []delivery.Message, in workflows.SendBatchInput) []error {
	if len(msgs) == 0 {
		return nil
	}
	for range msgs {
		a.Metrics.SendAttempt(in.Topic)
	}
	if _, ok := h.(delivery.BatchHandler); ok {
		return delivery.SendAll(ctx, h, msgs, in.Concurrency, in.SendTimeout)
	}
	traced := delivery.HandlerFunc(func(ctx context.Context, m delivery.Message) error {
		id, _ := uuid.Parse(m.MessageID)
		ctx, span := a.startSendSpan(ctx, rows[id], workflows.SendInput{MessageID: m.MessageID, Topic: m.Topic, Attempt: 1, MaxAttempts: in.MaxAttempts})
		defer span.End()
		err := h.Send(ctx, m)
		if err != nil {
			endSendSpan(span, teamactivity.ApplicationError(err))
		}
		return err
	})
	return delivery.SendAll(ctx, traced, msgs, in.Concurrency, in.SendTimeout)
}

// failedOutcome is a message's failed attempt, read from its ApplicationError.
func failedOutcome(messageID string, err error) workflows.BatchOutcome {
	o := workflows.BatchOutcome{MessageID: messageID, Outcome: workflows.BatchFailed, Error: err.Error(), ErrType: workflows.ErrTypeAmbiguous}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		o.Error, o.ErrType, o.RetryAfter = appErr.Message(), appErr.Type(), appErr.NextRetryDelay()
		if appErr.NonRetryable() && o.ErrType != workflows.ErrTypeUnknownTopic {
			o.ErrType = workflows.ErrTypePermanent
		}
	}
	return o
}

// recordBatchSent records the batch's delivered messages sent in one statement, within
// half the time the activity has left (a database that hangs must not turn a delivered
// batch into a timed-out one), and marks their outcomes recorded; when that fails the
// workflow's mark-sent-all step records them.
func (a *Activities) recordBatchSent(ctx context.Context, in workflows.SendBatchInput, delivered []uuid.UUID, outcomes []workflows.BatchOutcome) {
	var skipped int
	for _, o := range outcomes {
		if o.Outcome == workflows.BatchSkipped || o.Outcome == workflows.BatchAlreadySent {
			skipped++
		}
	}
	a.Metrics.BatchMessages(in.Topic, metrics.BatchOutcomeSkipped, skipped)
	if len(delivered) == 0 {
		return
	}
	a.Metrics.BatchMessages(in.Topic, metrics.BatchOutcomeSent, len(delivered))
	wait := 10 * time.Second
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline)/2)
	}
	markCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sent, err := a.Store.RecordSentAll(markCtx, delivered)
	if err != nil {
		a.Metrics.Error(metrics.OpMarkSent)
		a.logger().InfoContext(ctx, "Delivered the batch; its rows are recorded sent by the mark-sent-all step",
			slog.String("batch", in.Batch), slog.Int("messages", len(delivered)), slog.Any("error", err))
		return
	}
	for _, s := range sent {
		a.Metrics.Sent(s.Topic, s.Latency)
	}
	for i := range outcomes {
		if outcomes[i].Outcome == workflows.BatchSent {
			// Moved now, or by another run before: either way the row says sent.
			outcomes[i].Recorded = true
		}
	}
}

// recordBatchFailures counts and logs each failed message of the batch and records the
// failure on its row (retry_times, last_error), as the send activity does for one.
func (a *Activities) recordBatchFailures(ctx context.Context, in workflows.SendBatchInput, outcomes []workflows.BatchOutcome) {
	var failed int
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, o := range outcomes {
		if o.Outcome != workflows.BatchFailed {
			continue
		}
		failed++
		id, err := uuid.Parse(o.MessageID)
		if err != nil {
			continue
		}
		if err := a.noteFailure(recordCtx, id, in.Topic, 1, o.Error, o.ErrType, slog.String("batch", in.Batch)); err != nil {
			a.logger().WarnContext(ctx, "Cannot record send failure", slog.String("message_id", o.MessageID), slog.Any("error", err))
		}
	}
	a.Metrics.BatchMessages(in.Topic, metrics.BatchOutcomeHandedOver, failed)
}

// MarkSentAll records a batch's delivered messages sent, when the send-batch activity
// could not.
func (a *Activities) MarkSentAll(ctx context.Context, in workflows.MarkSentAllInput) error {
	ids := make([]uuid.UUID, 0, len(in.MessageIDs))
	for _, s := range in.MessageIDs {
		id, err := parseID(s)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	sent, err := a.Store.RecordSentAll(ctx, ids)
	if err != nil {
		a.Metrics.Error(metrics.OpMarkSent)
		return err
	}
	for _, s := range sent {
		a.Metrics.Sent(s.Topic, s.Latency)
	}
	return nil
}

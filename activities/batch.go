package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/tracing"
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
// A row is the batch's to send once it names this batch: the activity records the batch on
// the claimed rows that name none and that the claim which handed them to the batch still
// holds, before it sends (the relay does too, once the run has started;
// store.TakeForBatch). A row sent already is reported so, and one that another batch
// holds, that was dispatched to a run of its own (a relay that met this batch's ID started
// before gave its rows runs of their own), that was claimed again since (the new claim
// hands it over), or that is dead, discarded, pending again or gone, is skipped.
func (a *Activities) SendBatch(ctx context.Context, in workflows.SendBatchInput) (workflows.SendBatchResult, error) {
	out := workflows.SendBatchResult{Outcomes: make([]workflows.BatchOutcome, len(in.Messages))}
	if len(in.Messages) == 0 {
		return out, nil
	}
	if err := a.checkDeployment(ctx, in.Messages[0].MessageID, in.Deployment); err != nil {
		return out, err
	}
	ids := make([]uuid.UUID, 0, len(in.Messages))
	takes := make([]store.BatchTake, 0, len(in.Messages))
	for i, m := range in.Messages {
		out.Outcomes[i].MessageID = m.MessageID
		id, err := uuid.Parse(m.MessageID)
		if err != nil {
			out.Outcomes[i] = failedOutcome(m.MessageID, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("message_id must be a UUID, got %q", m.MessageID), workflows.ErrTypePermanent, nil))
			continue
		}
		// A token that does not parse (none, from a relay of an earlier release) is
		// unknown: the row is taken from whichever claim holds it, as before.
		token, _ := uuid.Parse(m.ClaimToken)
		ids, takes = append(ids, id), append(takes, store.BatchTake{MessageID: id, ClaimToken: token})
	}
	// The batch takes its rows first (batch_id): a row that another batch holds is that
	// batch's to send, so a row claimed again after its lease is never sent by two batches.
	// Both within storeContext's bound (two statements: twice its wait, well within the
	// heartbeat timeout), so a database that hangs leaves the batch with no attempt used.
	loadCtx, cancel := storeContext(ctx, 2*storeWait)
	_, err := a.Store.TakeForBatch(loadCtx, in.Batch, takes)
	var rows map[uuid.UUID]store.Row
	if err == nil {
		rows, err = a.Store.GetAll(loadCtx, ids)
	}
	cancel()
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
		case row.BatchID == nil:
			o.Outcome, o.Note = workflows.BatchSkipped, "the message has a run of its own"
		case *row.BatchID != in.Batch:
			o.Outcome, o.Note = workflows.BatchSkipped, "another batch holds the message: "+*row.BatchID
		case row.Paused:
			// Nothing is sent while the topic is paused, and no attempt is used: the
			// message's own run waits for the resume, as a single send does.
			*o = workflows.BatchOutcome{MessageID: m.MessageID, Outcome: workflows.BatchFailed,
				Error: fmt.Sprintf("topic %q is paused (outbox topic resume %s ends the pause)", row.Topic, row.Topic), ErrType: workflows.ErrTypeNotAttempted}
		case !known:
			*o = failedOutcome(m.MessageID, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("no handler for topic %q: add it under topics: in the config, or add a default: entry", in.Topic),
				workflows.ErrTypeUnknownTopic, nil))
		default:
			if err := checkPayloadSize(row, limit); err != nil {
				*o = failedOutcome(m.MessageID, err)
				continue
			}
			send = append(send, message(row, 1, rowMaxAttempts(row, in.MaxAttempts)))
			sendAt = append(sendAt, i)
		}
	}

	stop := heartbeat(ctx)
	rec := a.newSentRecorder(ctx, in)
	defer rec.halt() // a handler that panics skips finish
	// The whole batch has one send timeout: a message whose turn comes later is not
	// sent, and leaves the batch with no attempt used.
	defer stop() // after the recording below too
	sendCtx, cancel := context.WithTimeout(ctx, in.SendTimeout)
	errs := a.sendAll(sendCtx, h, rows, send, in, rec.delivered)
	cancel()
	for j, err := range errs {
		o := &out.Outcomes[sendAt[j]]
		if err == nil {
			o.Outcome = workflows.BatchSent
			rec.delivered(o.MessageID)
			continue
		}
		if errors.Is(err, delivery.ErrConnectionLost) {
			a.Metrics.ConnectionLost(in.Topic)
		}
		if errors.Is(err, delivery.ErrNotAttempted) {
			*o = workflows.BatchOutcome{MessageID: o.MessageID, Outcome: workflows.BatchFailed, Error: err.Error(), ErrType: workflows.ErrTypeNotAttempted}
			continue
		}
		*o = failedOutcome(o.MessageID, teamactivity.ApplicationError(err))
	}
	rec.finish(out.Outcomes)
	a.recordBatchFailures(ctx, in, out.Outcomes)
	return out, nil
}

// sendAll sends msgs with h, each message in a span of its own that continues the
// message's trace, as a single send's does: the handler's batch publish, or one send per
// message with delivered called for each message the downstream took as soon as it took
// it.
func (a *Activities) sendAll(ctx context.Context, h delivery.Handler, rows map[uuid.UUID]store.Row, msgs []delivery.Message,
	in workflows.SendBatchInput, delivered func(messageID string)) []error {
	if len(msgs) == 0 {
		return nil
	}
	if _, ok := h.(delivery.BatchHandler); ok {
		return a.sendBatchTraced(ctx, h, rows, msgs, in)
	}
	traced := delivery.HandlerFunc(func(ctx context.Context, m delivery.Message) error {
		a.Metrics.SendAttempt(in.Topic)
		id, _ := uuid.Parse(m.MessageID)
		ctx, span := a.startSendSpan(ctx, rows[id], workflows.SendInput{MessageID: m.MessageID, Topic: m.Topic, Attempt: 1, MaxAttempts: m.MaxAttempts})
		defer span.End()
		err := h.Send(ctx, m)
		if err != nil {
			endSendSpan(span, teamactivity.ApplicationError(err))
			return err
		}
		delivered(m.MessageID)
		return nil
	})
	return delivery.SendAll(ctx, traced, msgs, in.Concurrency, in.SendTimeout)
}

// sendBatchTraced publishes msgs with a batch handler: each message gets its send span,
// whose context its headers carry in place of the row's, and the publish runs without the
// activity's span, so that the sink (sinks.Headers) writes each message's own trace
// context rather than the batch run's for all of them.
func (a *Activities) sendBatchTraced(ctx context.Context, h delivery.Handler, rows map[uuid.UUID]store.Row, msgs []delivery.Message,
	in workflows.SendBatchInput) []error {
	spans := make([]trace.Span, len(msgs))
	traced := make([]delivery.Message, len(msgs))
	for i, m := range msgs {
		a.Metrics.SendAttempt(in.Topic)
		id, _ := uuid.Parse(m.MessageID)
		spanCtx, span := a.startSendSpan(ctx, rows[id], workflows.SendInput{MessageID: m.MessageID, Topic: m.Topic, Attempt: 1, MaxAttempts: m.MaxAttempts})
		spans[i] = span
		if span.SpanContext().IsValid() {
			m.Headers = tracing.Replace(spanCtx, maps.Clone(m.Headers))
		}
		traced[i] = m
	}
	errs := delivery.SendAll(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), h, traced, in.Concurrency, in.SendTimeout)
	for i, span := range spans {
		if errs[i] != nil {
			endSendSpan(span, teamactivity.ApplicationError(errs[i]))
		}
		span.End()
	}
	return errs
}

// BatchRecordInterval is how often a batch's send records the messages delivered since
// the last time, while it sends; it records them sooner once as many are waiting as it
// sends at once. A batch lost with its worker hands over its messages, and their own runs
// send again only those delivered and not recorded yet.
var BatchRecordInterval = 100 * time.Millisecond

// sentRecorder records a batch's delivered messages sent as they are delivered: every
// BatchRecordInterval, or as soon as the batch's concurrency of them wait, the ones
// delivered since, in one statement; and the rest when the send ends.
type sentRecorder struct {
	a   *Activities
	in  workflows.SendBatchInput
	ctx context.Context

	mu       sync.Mutex
	pending  []uuid.UUID
	recorded map[string]bool
	all      int
	flushing sync.Mutex // one flush at a time
	full     chan struct{}
	stop     chan struct{}
	stopped  chan struct{}
	halted   sync.Once
}

func (a *Activities) newSentRecorder(ctx context.Context, in workflows.SendBatchInput) *sentRecorder {
	r := &sentRecorder{a: a, in: in, ctx: ctx, recorded: map[string]bool{},
		full: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(r.stopped)
		t := time.NewTicker(BatchRecordInterval)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			case <-r.full:
			}
			r.flush(ctx)
		}
	}()
	return r
}

// delivered notes a message the downstream took; a second note of one is ignored.
func (r *sentRecorder) delivered(messageID string) {
	id, err := uuid.Parse(messageID)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.recorded[messageID]; seen {
		return
	}
	r.recorded[messageID] = false
	r.all++
	r.pending = append(r.pending, id)
	if len(r.pending) >= max(r.in.Concurrency, 1) {
		select {
		case r.full <- struct{}{}:
		default:
		}
	}
}

// flush records the messages delivered since the last flush, within half the time the
// activity has left (a database that hangs must not turn a delivered batch into a
// timed-out one); those it could not record wait for the next flush.
func (r *sentRecorder) flush(ctx context.Context) {
	r.flushing.Lock()
	defer r.flushing.Unlock()
	r.mu.Lock()
	ids := r.pending
	r.pending = nil
	r.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	markCtx, cancel := context.WithTimeout(ctx, recordWait(r.ctx))
	defer cancel()
	sent, err := r.a.Store.RecordSentAll(markCtx, ids)
	if err != nil {
		r.a.Metrics.Error(metrics.OpMarkSent)
		r.a.logger().InfoContext(ctx, "Cannot record delivered messages of the batch sent yet; trying again",
			slog.String("batch", r.in.Batch), slog.Int("messages", len(ids)), slog.Any("error", err))
		r.mu.Lock()
		r.pending = append(ids, r.pending...)
		r.mu.Unlock()
		return
	}
	for _, s := range sent {
		r.a.Metrics.Sent(s.Topic, s.Latency)
	}
	r.mu.Lock()
	for _, id := range ids {
		// Moved now, or by another run before: either way the row says sent.
		r.recorded[id.String()] = true
	}
	r.mu.Unlock()
}

// recordWait bounds one write of the batch's outcome: half the time the activity has left
// (a database that hangs must not turn a delivered batch into a timed-out one), at most
// 10s, and at least a second even when that time has run out (the write then still spares
// the messages' own runs a resend).
func recordWait(ctx context.Context) time.Duration {
	return max(storeBound(ctx, 10*time.Second), time.Second)
}

// finish stops the recorder, records what is left and marks the delivered outcomes that
// are recorded; the workflow's mark-sent-all step records the others.
func (r *sentRecorder) finish(outcomes []workflows.BatchOutcome) {
	r.halt()
	var skipped int
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range outcomes {
		switch o := &outcomes[i]; o.Outcome {
		case workflows.BatchSent:
			o.Recorded = r.recorded[o.MessageID]
		case workflows.BatchSkipped, workflows.BatchAlreadySent:
			skipped++
		}
	}
	r.a.Metrics.BatchMessages(r.in.Topic, metrics.BatchOutcomeSent, r.all)
	r.a.Metrics.BatchMessages(r.in.Topic, metrics.BatchOutcomeSkipped, skipped)
}

// halt stops the recorder's flushes and records what was delivered since the last one.
// It runs once: at finish, or deferred, when the handler panicked before it.
func (r *sentRecorder) halt() {
	r.halted.Do(func() {
		close(r.stop)
		<-r.stopped
		// Past the activity's end too: a row recorded sent is one its own run will not
		// send.
		r.flush(context.WithoutCancel(r.ctx))
	})
}

// heartbeat records the activity's heartbeat every workflows.BatchHeartbeatInterval until
// stop is called, so that Temporal notices a lost worker within the heartbeat timeout.
// Outside an activity (a test calling the method) it does nothing.
func heartbeat(ctx context.Context) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(workflows.BatchHeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return func() { close(done); <-stopped }
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

// recordBatchFailures counts and logs each failed message of the batch and records the
// failure on its row (retry_times, last_error), as the send activity does for one.
func (a *Activities) recordBatchFailures(ctx context.Context, in workflows.SendBatchInput, outcomes []workflows.BatchOutcome) {
	var failed int
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait(ctx))
	defer cancel()
	for _, o := range outcomes {
		if o.Outcome != workflows.BatchFailed {
			continue
		}
		failed++
		if o.ErrType == workflows.ErrTypeNotAttempted {
			continue // nothing was sent: no attempt to record
		}
		id, err := uuid.Parse(o.MessageID)
		if err != nil {
			continue
		}
		if err := a.noteFailure(recordCtx, id, in.Topic, 1, o.Error, o.ErrType, slog.String("batch", in.Batch)); err != nil {
			// Nothing records it again: the attempt's failure is counted all the same.
			a.Metrics.SendFailed(in.Topic, o.ErrType)
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

// rowMaxAttempts is the attempts a message of a batch has: its row's max_retry_times + 1
// when the writer set it, as its own run would have (workflows.ResolvePolicy), else the
// topic's.
func rowMaxAttempts(row store.Row, topic int) int {
	if row.MaxRetryTimes != nil {
		return *row.MaxRetryTimes + 1
	}
	return topic
}

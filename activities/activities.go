package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/sinks/teamactivity"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// Activities are the delivery workflow's activities. Register them with
// worker.Register, or with Register on any worker.
type Activities struct {
	Store    store.Delivery
	Handlers *Registry
	Logger   *slog.Logger
	// Alerts posts a webhook for each dead letter, besides the error log line. Optional.
	Alerts *AlertWebhooks
	// Metrics records sends, their failures, sent and dead-lettered messages. Nil records
	// nothing.
	Metrics *metrics.Metrics
	// TracerProvider makes the send span, which continues the trace of the enqueuing
	// span. Defaults to the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// Client signals teams' workflows for topics with a signal. Optional otherwise.
	Client client.Client
	// MaxSendsPerTopic caps the sends of one topic that run at once in this process: a
	// send over the cap is not made and fails with a retryable ErrTypeTopicBusy error,
	// after which the delivery waits and asks again without using an attempt. So a topic
	// whose downstream hangs holds at most this many of the worker's slots. 0 means no
	// cap.
	MaxSendsPerTopic int

	slotsMu sync.Mutex
	slots   map[string]int // sends running, by topic
}

// takeSlot counts a send of topic as running, unless the topic has MaxSendsPerTopic
// running already; it reports whether it did. Each take is given back with giveSlot.
func (a *Activities) takeSlot(topic string) bool {
	if a.MaxSendsPerTopic <= 0 {
		return true
	}
	a.slotsMu.Lock()
	defer a.slotsMu.Unlock()
	if a.slots[topic] >= a.MaxSendsPerTopic {
		return false
	}
	if a.slots == nil {
		a.slots = map[string]int{}
	}
	a.slots[topic]++
	return true
}

func (a *Activities) giveSlot(topic string) {
	if a.MaxSendsPerTopic <= 0 {
		return
	}
	a.slotsMu.Lock()
	defer a.slotsMu.Unlock()
	if a.slots[topic]--; a.slots[topic] <= 0 {
		delete(a.slots, topic)
	}
}

// Register adds the activities to r under their workflow-facing names.
func (a *Activities) Register(r interface {
	RegisterActivityWithOptions(any, activity.RegisterOptions)
}) {
	r.RegisterActivityWithOptions(a.Send, activity.RegisterOptions{Name: workflows.ActivitySend})
	r.RegisterActivityWithOptions(a.CheckProcessed, activity.RegisterOptions{Name: workflows.ActivityCheckProcessed})
	r.RegisterActivityWithOptions(a.MarkSent, activity.RegisterOptions{Name: workflows.ActivityMarkSent})
	r.RegisterActivityWithOptions(a.DeadLetter, activity.RegisterOptions{Name: workflows.ActivityDeadLetter})
	r.RegisterActivityWithOptions(a.PurgeBatch, activity.RegisterOptions{Name: workflows.ActivityPurgeBatch})
	r.RegisterActivityWithOptions(a.LoadMessage, activity.RegisterOptions{Name: workflows.ActivityLoadMessage})
	r.RegisterActivityWithOptions(a.SignalWithStart, activity.RegisterOptions{Name: workflows.ActivitySignalWithStart})
	r.RegisterActivityWithOptions(a.RecordFailure, activity.RegisterOptions{Name: workflows.ActivityRecordFailure})
	r.RegisterActivityWithOptions(a.SendBatch, activity.RegisterOptions{Name: workflows.ActivitySendBatch})
	r.RegisterActivityWithOptions(a.MarkSentAll, activity.RegisterOptions{Name: workflows.ActivityMarkSentAll})
}

func (a *Activities) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("message_id must be a UUID, got %q", s), workflows.ErrTypePermanent, nil)
	}
	return id, nil
}

// storeWait is the longest a database step of an activity waits (see storeContext).
const storeWait = 5 * time.Second

// storeContext bounds a database step of an activity to most, and to half the time the
// activity has left: a database that hangs (a partition without a reset, a pool with no
// free connection) then fails the step with the outbox's "database unavailable", which
// uses up no attempt, before the activity's own timeout turns it into an ambiguous
// attempt. The step ends with ctx too.
func storeContext(ctx context.Context, most time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, storeBound(ctx, most))
}

// storeBound is most, or half the time ctx has left when that is shorter.
func storeBound(ctx context.Context, most time.Duration) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		most = min(most, time.Until(deadline)/2)
	}
	return most
}

// loadRow returns the message's row, or an error that ends the delivery (not in the
// table) or that the workflow retries (the outbox's database unavailable, or not answering
// within storeContext's bound).
func (a *Activities) loadRow(ctx context.Context, messageID string) (store.Row, error) {
	id, err := parseID(messageID)
	if err != nil {
		return store.Row{}, err
	}
	getCtx, cancel := storeContext(ctx, storeWait)
	row, err := a.Store.Get(getCtx, id)
	cancel()
	if errors.Is(err, store.ErrNotFound) {
		return row, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("message %s is not in the outbox table", id), workflows.ErrTypePermanent, nil)
	}
	if err != nil {
		// The outbox's own database is unavailable: nothing was sent, and it is not the
		// downstream's failure, so the workflow tries the same attempt again later.
		return row, temporal.NewApplicationError(err.Error(), workflows.ErrTypeStoreUnavailable)
	}
	return row, nil
}

// load returns the message and its handler, or an error that ends the delivery.
func (a *Activities) load(ctx context.Context, messageID string) (store.Row, delivery.Handler, error) {
	row, err := a.loadRow(ctx, messageID)
	if err != nil {
		return row, nil, err
	}
	h, err := a.handler(row)
	return row, h, err
}

// handler returns the handler of the row's topic, or an error that ends the delivery.
func (a *Activities) handler(row store.Row) (delivery.Handler, error) {
	h, ok := a.Handlers.Lookup(row.Topic)
	if !ok {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("no handler for topic %q: add it under topics: in the config, or add a default: entry", row.Topic),
			workflows.ErrTypeUnknownTopic, nil)
	}
	return h, nil
}

// checkDeployment refuses a message of another outbox deployment (DeliveryInput.Deployment
// set by that outbox's relay) with a retryable ErrTypeWrongDeployment error, before
// anything reads this worker's tables: this worker's database does not hold the message,
// and the workflow asks again for a worker of its own. An empty deployment (a run started
// by an older relay) is not checked.
func (a *Activities) checkDeployment(ctx context.Context, messageID, deployment string) error {
	if deployment == "" {
		return nil
	}
	idCtx, cancel := storeContext(ctx, storeWait)
	own, err := a.Store.DeploymentID(idCtx)
	cancel()
	switch {
	case store.IsDeploymentMissing(err):
		// This schema predates the deployment, so the relay that named one used another
		// database.
	case err != nil:
		return temporal.NewApplicationError(err.Error(), workflows.ErrTypeStoreUnavailable)
	case own.String() == deployment:
		return nil
	}
	attrs := []any{slog.String("message_id", messageID), slog.String("deployment", deployment), slog.String("own_deployment", own.String())}
	if activity.IsActivity(ctx) {
		attrs = append(attrs, slog.String("task_queue", activity.GetInfo(ctx).TaskQueue))
	}
	a.logger().WarnContext(ctx, "Refused a message of another outbox deployment: this task queue is polled by workers of more than one outbox database, and a task queue belongs to one", attrs...)
	return temporal.NewApplicationError(
		fmt.Sprintf("message %s belongs to outbox deployment %s; this worker's is %s (a task queue belongs to one outbox database)", messageID, deployment, own),
		workflows.ErrTypeWrongDeployment)
}

func isStoreUnavailable(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == workflows.ErrTypeStoreUnavailable
}

// message is the row as a handler receives it for attempt attempt of maxAttempts.
func message(row store.Row, attempt, maxAttempts int) delivery.Message {
	m := delivery.Message{
		MessageID: row.MessageID.String(), Topic: row.Topic, Payload: row.Payload, Headers: row.Headers,
		CreatedAt: row.CreatedAt, Attempt: attempt, MaxAttempts: maxAttempts,
	}
	if row.OrderingKey != nil {
		m.OrderingKey = *row.OrderingKey
	}
	return m
}

// Send is one delivery attempt: it loads the message, hands it to its topic's handler and
// returns the handler's failure as an ApplicationError the workflow can classify. A failed
// attempt is recorded on the row (retry_times, last_error); a delivered one is recorded
// sent, and the result says whether that took (the workflow then needs no mark-sent step).
// The workflow runs it as a regular activity, or as a local activity for a first attempt.
func (a *Activities) Send(ctx context.Context, in workflows.SendInput) (workflows.SendResult, error) {
	if err := a.checkDeployment(ctx, in.MessageID, in.Deployment); err != nil {
		return workflows.SendResult{}, err
	}
	if !a.takeSlot(in.Topic) {
		return workflows.SendResult{}, temporal.NewApplicationError(
			fmt.Sprintf("topic %q has %d sends running on this worker, its limit (worker.max_sends_per_topic): its downstream is slow or hangs; the send waits for a slot", in.Topic, a.MaxSendsPerTopic),
			workflows.ErrTypeTopicBusy)
	}
	defer a.giveSlot(in.Topic)
	// The row's state comes before its topic's handler: a row recorded sent stays a no-op
	// on a worker without the handler (one of an earlier release, in a rolling deploy),
	// and a paused topic's row waits there too.
	row, err := a.loadRow(ctx, in.MessageID)
	if isStoreUnavailable(err) {
		a.Metrics.SendAttempt(in.Topic)
		a.Metrics.SendFailed(in.Topic, workflows.ErrTypeStoreUnavailable)
		a.logger().WarnContext(ctx, "Cannot load the message: the outbox database is unavailable",
			slog.String("message_id", in.MessageID), slog.String("topic", in.Topic), slog.Int("attempt", in.Attempt), slog.Any("error", err))
		return workflows.SendResult{}, err
	}
	if err != nil {
		a.Metrics.SendAttempt(in.Topic)
		a.recordFailure(ctx, in, err)
		return workflows.SendResult{}, err
	}
	// A paused topic's message, and one no longer to be sent, are not an attempt: nothing
	// is sent.
	if row.Paused && row.Status != store.StatusSent {
		// Nothing is sent while the topic is paused, and no attempt is used up: the
		// workflow waits and asks again.
		return workflows.SendResult{}, temporal.NewApplicationError(
			fmt.Sprintf("topic %q is paused (outbox topic resume %s ends the pause)", row.Topic, row.Topic), workflows.ErrTypeTopicPaused)
	}
	switch row.Status {
	case store.StatusSent:
		// Recorded as delivered by an earlier run (or by this attempt before its worker
		// was lost): sending again would duplicate it.
		return workflows.SendResult{Recorded: true}, nil
	case store.StatusDead, store.StatusDiscarded:
		return workflows.SendResult{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("message %s is %s", row.MessageID, row.Status), workflows.ErrTypePermanent, nil)
	}
	h, err := a.sendHandler(row)
	if err != nil {
		a.Metrics.SendAttempt(in.Topic)
		a.recordFailure(ctx, in, err)
		return workflows.SendResult{}, err
	}
	a.Metrics.SendAttempt(in.Topic)
	ctx, span := a.startSendSpan(ctx, row, in)
	defer span.End()
	began := time.Now()
	err = h.Send(ctx, message(row, in.Attempt, in.MaxAttempts))
	a.Metrics.SendDuration(in.Topic, time.Since(began))
	if err == nil {
		return workflows.SendResult{Recorded: a.recordDelivered(ctx, in)}, nil
	}
	if errors.Is(err, delivery.ErrConnectionLost) {
		a.Metrics.ConnectionLost(in.Topic)
	}
	appErr := teamactivity.ApplicationError(err)
	endSendSpan(span, appErr)
	a.recordFailure(ctx, in, appErr)
	return workflows.SendResult{}, appErr
}

// recordDelivered records the row sent as soon as the handler accepted it, so the row
// (and the next message of its ordering key) does not wait for the workflow's next task.
// It reports whether the row is recorded sent now; when it is not, the workflow's
// mark-sent step records it.
func (a *Activities) recordDelivered(ctx context.Context, in workflows.SendInput) bool {
	id, err := uuid.Parse(in.MessageID)
	if err != nil {
		return false
	}
	// A database that hangs must not turn a delivered attempt into a timed-out
	// (ambiguous) one.
	markCtx, cancel := storeContext(ctx, storeWait)
	defer cancel()
	if _, err := a.markSent(markCtx, id); err != nil {
		a.logger().InfoContext(ctx, "Delivered; the row is recorded sent by the mark-sent step",
			slog.String("message_id", in.MessageID), slog.Any("error", err))
		return false
	}
	return true
}

func (a *Activities) recordFailure(ctx context.Context, in workflows.SendInput, err error) {
	id, perr := uuid.Parse(in.MessageID)
	if perr != nil {
		return
	}
	msg := err.Error()
	var appErr *temporal.ApplicationError
	errType := ""
	if errors.As(err, &appErr) {
		msg, errType = appErr.Message(), appErr.Type()
	}
	// Recorded even when the activity was cancelled meanwhile, but within the time it
	// has left: a database that hangs must not hold back the handler's answer (a
	// permanent failure, a Retry-After) until the attempt times out as ambiguous.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeBound(ctx, 10*time.Second))
	defer cancel()
	if rerr := a.noteFailure(recordCtx, id, in.Topic, in.Attempt, msg, errType, slog.Int("max_attempts", in.MaxAttempts)); rerr != nil {
		// Nothing records it again: the attempt's failure is counted all the same.
		a.Metrics.SendFailed(in.Topic, errType)
		a.logger().WarnContext(ctx, "Cannot record send failure", slog.String("message_id", in.MessageID), slog.Any("error", rerr))
	}
}

// noteFailure logs a failed attempt, records it on the row (retry_times, last_error) and,
// once recorded, counts it; it returns the error of the row update, which RecordFailure's
// retries may follow, so a failure is counted once however many tries recording it took.
func (a *Activities) noteFailure(ctx context.Context, id uuid.UUID, topic string, attempt int, msg, errType string, attrs ...any) error {
	a.logger().WarnContext(ctx, "Send attempt failed", append([]any{
		slog.String("message_id", id.String()), slog.String("topic", topic), slog.Int("attempt", attempt)},
		append(attrs, slog.String("error", msg))...)...)
	if _, err := a.Store.RecordFailure(ctx, id, attempt, msg); err != nil {
		a.Metrics.Error(metrics.OpRecordFailure)
		return err
	}
	a.Metrics.SendFailed(topic, errType)
	return nil
}

// CheckProcessed asks the topic's handler whether the downstream already has the message.
func (a *Activities) CheckProcessed(ctx context.Context, in workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
	if err := a.checkDeployment(ctx, in.MessageID, in.Deployment); err != nil {
		return workflows.CheckProcessedResult{}, err
	}
	row, h, err := a.load(ctx, in.MessageID)
	if err != nil {
		return workflows.CheckProcessedResult{}, err
	}
	c, ok := h.(delivery.Checker)
	if !ok {
		return workflows.CheckProcessedResult{}, nil
	}
	processed, err := c.CheckProcessed(ctx, message(row, 0, 0))
	if errors.Is(err, delivery.ErrCheckUnsupported) {
		return workflows.CheckProcessedResult{}, nil
	}
	if err != nil {
		return workflows.CheckProcessedResult{}, fmt.Errorf("check whether message %s was processed: %w", row.MessageID, err)
	}
	return workflows.CheckProcessedResult{Supported: true, Processed: processed}, nil
}

// MarkSent records the message as delivered.
func (a *Activities) MarkSent(ctx context.Context, in workflows.MarkSentInput) error {
	id, err := parseID(in.MessageID)
	if err != nil {
		return err
	}
	sent, err := a.markSent(ctx, id)
	if err != nil {
		return err
	}
	if sent != nil && in.TeamAttempt {
		// The team's attempt that delivered it, counted once: with the row's change.
		a.Metrics.SendAttempt(sent.Topic)
	}
	if sent == nil {
		// The usual case: the send activity recorded the row when the handler accepted it.
		a.logger().DebugContext(ctx, "Message already recorded; mark-sent changed nothing", slog.String("message_id", in.MessageID))
	}
	return nil
}

// DeadLetter writes the message's dead letter and moves its row to dead. It logs the
// reason at error level, the hook an alert can follow. A row recorded sent gets none, and
// the result says so.
func (a *Activities) DeadLetter(ctx context.Context, in workflows.DeadLetterInput) (workflows.DeadLetterResult, error) {
	id, err := parseID(in.MessageID)
	if err != nil {
		return workflows.DeadLetterResult{}, err
	}
	moved, err := a.Store.DeadLetter(ctx, store.DeadLetter{
		MessageID: id, Topic: in.Topic, WorkflowID: in.WorkflowID, RunID: in.RunID,
		Attempts: in.Attempts, LastError: in.LastError,
	})
	if err != nil {
		a.Metrics.Error(metrics.OpDeadLetter)
		return workflows.DeadLetterResult{}, err
	}
	if !moved {
		// A sent row gets no dead letter: say so, and the run ends delivered.
		if row, err := a.Store.Get(ctx, id); err == nil && row.Status == store.StatusSent {
			return workflows.DeadLetterResult{AlreadySent: true}, nil
		}
	}
	if moved {
		a.Metrics.DeadLettered(in.Topic)
		a.logger().ErrorContext(ctx, "Message dead-lettered",
			slog.String("message_id", in.MessageID), slog.String("topic", in.Topic),
			slog.Int("attempts", in.Attempts), slog.String("reason", in.LastError),
			slog.String("workflow_id", in.WorkflowID), slog.String("run_id", in.RunID),
			slog.Time("at", time.Now()))
		a.alert(ctx, in)
	}
	return workflows.DeadLetterResult{}, nil
}

// alert posts the dead letter to its webhook. A failing webhook is logged, not retried:
// the dead letter itself is recorded, and the error log line is the alert of last resort.
func (a *Activities) alert(ctx context.Context, in workflows.DeadLetterInput) {
	err := a.Alerts.Send(ctx, DeadLetterAlert{
		Event: "outbox.dead_lettered", MessageID: in.MessageID, Topic: in.Topic, Attempts: in.Attempts,
		Reason: in.LastError, WorkflowID: in.WorkflowID, RunID: in.RunID, At: time.Now().UTC(),
	})
	if err != nil {
		a.logger().WarnContext(ctx, "Dead-letter alert webhook failed", slog.String("message_id", in.MessageID), slog.Any("error", err))
	}
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	enumspb "go.temporal.io/api/enums/v1"
	failurepb "go.temporal.io/api/failure/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// historyTimeout bounds the Temporal part of outbox show: a message's row is shown even when
// Temporal does not answer.
const historyTimeout = 15 * time.Second

func newShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show MESSAGE_ID",
		Short: "Show what happened to a message in any state: its row, every attempt with its error, dead letters, audit and UI link",
		Long: `Show what happened to a message, whatever its state: the row (status, retries, the
next attempt, the last error, the payload), every activity of each of its workflow runs with
its time and error (read from the Temporal history: the first attempt is the local activity
of the first workflow task, later attempts regular activities), its dead letters, the
operator actions on it, and a link to each run in the Temporal Web UI.

When Temporal does not answer, the row, dead letters and audit are still shown, with the
reason the attempts are missing.`,
		Example: `  outbox show 01937f4e-1c2d-7a3b-9f10-2b6c8d4e5f60
  outbox show 01937f4e-1c2d-7a3b-9f10-2b6c8d4e5f60 --json | jq '.runs[].attempts'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				v, err := inspectMessage(cmd.Context(), a, ids[0])
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), v)
				}
				v.write(cmd.OutOrStdout())
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// messageView is everything outbox show knows about a message.
type messageView struct {
	MessageID     uuid.UUID          `json:"message_id"`
	Topic         string             `json:"topic"`
	Status        store.Status       `json:"status,omitempty"`       // empty when the row is gone (retention)
	Paused        bool               `json:"topic_paused,omitempty"` // the topic is paused (outbox topic pause)
	HeldBack      bool               `json:"held_back,omitempty"`    // parked by the claim (see storedriver.Row.HeldBack)
	Payload       json.RawMessage    `json:"payload,omitempty"`
	Headers       map[string]string  `json:"headers,omitempty"`
	RetryTimes    int                `json:"retry_times"`
	MaxRetryTimes *int               `json:"max_retry_times,omitempty"`
	NextRetryAt   *time.Time         `json:"next_retry_at,omitempty"`
	LastError     *string            `json:"last_error,omitempty"`
	RedriveCount  int                `json:"redrive_count"`
	CreatedAt     *time.Time         `json:"created_at,omitempty"`
	SentAt        *time.Time         `json:"sent_at,omitempty"`
	OrderingKey   *string            `json:"ordering_key,omitempty"`
	OrderingSeq   *int64             `json:"ordering_seq,omitempty"`
	Batch         *batchView         `json:"batch,omitempty"` // the batch run the message was handed to (lane batch)
	Runs          []runView          `json:"runs"`
	HistoryError  string             `json:"history_error,omitempty"` // why Runs is empty or short
	DeadLetters   []deadLetterJSON   `json:"dead_letters"`
	Audit         []store.AuditEntry `json:"audit"`
	rowMissing    bool
}

// runView is one workflow run of the message and the activities its history records.
type runView struct {
	WorkflowID string        `json:"workflow_id"`
	RunID      string        `json:"run_id"`
	Status     string        `json:"status"` // Running, Completed, Failed, ...
	Start      time.Time     `json:"start_time"`
	Close      *time.Time    `json:"close_time,omitempty"`
	URL        string        `json:"url"`
	Attempts   []attemptView `json:"attempts"`
}

// batchView is the OutboxBatch run a message of the batch lane was handed to, and what
// the message came to in it.
type batchView struct {
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id,omitempty"`
	Status     string `json:"status,omitempty"` // Running, Completed, ...; empty when the run is gone
	URL        string `json:"url"`
	// Outcome is the message's in the batch's result (sent, handed_over, ...), once the
	// batch completed; Error its failed attempt's error.
	Outcome string `json:"outcome,omitempty"`
	Error   string `json:"error,omitempty"`
}

// attemptView is one activity execution in a run's history.
type attemptView struct {
	Activity string `json:"activity"` // OutboxSend, OutboxCheckProcessed, a team's activity, ...
	Attempt  int    `json:"attempt"`  // counts the executions of this activity in the run, from 1
	Local    bool   `json:"local"`    // ran as a local activity inside a workflow task
	// Nexus marks an operation of a Nexus topic's service; Activity is then its
	// endpoint/service/operation.
	Nexus   bool      `json:"nexus,omitempty"`
	At      time.Time `json:"time"`    // when it was scheduled (recorded, for a local activity)
	Outcome string    `json:"outcome"` // ok, failed, timed out, canceled or running
	Error   string    `json:"error,omitempty"`
}

// inspectMessage gathers the row, dead letters, audit and, when Temporal answers, the runs
// of the message. A message with neither a row nor a dead letter nor a run is an error.
func inspectMessage(ctx context.Context, a *app.App, id uuid.UUID) (*messageView, error) {
	v := &messageView{MessageID: id, Runs: []runView{}}
	row, err := a.Driver.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		v.rowMissing = true
	case err != nil:
		return nil, err
	default:
		v.Topic, v.Status, v.Payload, v.Headers = row.Topic, row.Status, row.Payload, row.Headers
		v.Paused, v.HeldBack = row.Paused, row.HeldBack
		v.RetryTimes, v.MaxRetryTimes, v.NextRetryAt, v.LastError = row.RetryTimes, row.MaxRetryTimes, row.NextRetryAt, row.LastError
		v.RedriveCount, v.CreatedAt, v.SentAt = row.RedriveCount, &row.CreatedAt, row.SentAt
		v.OrderingKey, v.OrderingSeq = row.OrderingKey, row.OrderingSeq
		if row.BatchID != nil {
			v.Batch = &batchView{WorkflowID: *row.BatchID, URL: workflowURL(a, *row.BatchID, "")}
		}
	}
	dls, err := a.Driver.DeadLetters(ctx, id)
	if err != nil {
		return nil, err
	}
	v.DeadLetters = deadLettersJSON(dls)
	for i := range v.DeadLetters {
		v.DeadLetters[i].URL = workflowURL(a, v.DeadLetters[i].WorkflowID, v.DeadLetters[i].RunID)
	}
	if v.Topic == "" && len(dls) > 0 {
		v.Topic = dls[len(dls)-1].Topic
	}
	if v.Audit, err = a.Driver.Audit(ctx, id); err != nil {
		return nil, err
	}
	if v.Audit == nil {
		v.Audit = []store.AuditEntry{}
	}

	hctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	runIDs := make([]string, 0, len(dls))
	for _, d := range dls {
		if !slices.Contains(runIDs, d.RunID) {
			runIDs = append(runIDs, d.RunID)
		}
	}
	v.Runs, err = readRuns(hctx, a, workflows.WorkflowID(id.String()), runIDs)
	historyErr := err
	if err != nil {
		v.HistoryError = err.Error()
	}
	if v.Batch != nil && err == nil {
		if err := readBatch(hctx, a, v.Batch, id); err != nil {
			v.Batch.Error = "(the batch's run could not be read: " + err.Error() + ")"
		}
	}
	if v.rowMissing && len(dls) == 0 && len(v.Runs) == 0 {
		if historyErr != nil {
			// Temporal not answering is why the message cannot be told apart from none
			// (exit 69, as for a database that does not answer).
			return nil, fmt.Errorf("message %s: no row in schema %s and no dead letter; its workflow history could not be read: %w",
				id, a.Driver.Schema(), historyErr)
		}
		return nil, fmt.Errorf("message %s not found: no row in schema %s, no dead letter and no workflow %s in namespace %s "+
			"(retention removes sent and discarded rows, and Temporal closed runs, after their retention period)",
			id, a.Driver.Schema(), workflows.WorkflowID(id.String()), a.Config.Temporal.Namespace)
	}
	return v, nil
}

// readRuns reads the given runs of workflowID and its latest run, oldest first.
func readRuns(ctx context.Context, a *app.App, workflowID string, runIDs []string) ([]runView, error) {
	opts, err := app.ClientOptions(a.Config)
	if err != nil {
		return nil, err
	}
	c, err := app.Dial(ctx, a.Config)
	if err != nil {
		if app.IsConfigError(err) {
			return nil, err
		}
		return nil, &app.UnavailableError{Service: "Temporal", Err: err}
	}
	defer c.Close()
	dc, fc := opts.DataConverter, opts.FailureConverter
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	if fc == nil {
		fc = temporal.GetDefaultFailureConverter()
	}

	runs := []runView{}
	seen := map[string]bool{}
	// The latest run ("" asks for it) last: a redriven message's earlier runs come first.
	for _, runID := range append(slices.Clone(runIDs), "") {
		desc, err := c.DescribeWorkflowExecution(ctx, workflowID, runID)
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) {
			continue // a run past the namespace's retention, or a message not started yet
		}
		if temporalx.Unanswered(err) {
			return runs, &app.UnavailableError{Service: "Temporal", Err: fmt.Errorf("describe workflow %s: %w", workflowID, err)}
		}
		if err != nil {
			return runs, fmt.Errorf("describe workflow %s: %w", workflowID, err)
		}
		info := desc.GetWorkflowExecutionInfo()
		id := info.GetExecution().GetRunId()
		if seen[id] {
			continue
		}
		seen[id] = true
		r := runView{
			WorkflowID: workflowID, RunID: id, URL: workflowURL(a, workflowID, id),
			Status: statusName(info.GetStatus()), Start: info.GetStartTime().AsTime(),
		}
		if info.GetCloseTime() != nil {
			t := info.GetCloseTime().AsTime()
			r.Close = &t
		}
		if r.Attempts, err = runAttempts(ctx, c, dc, fc, workflowID, id); err != nil {
			return runs, err
		}
		runs = append(runs, r)
	}
	slices.SortStableFunc(runs, func(x, y runView) int { return x.Start.Compare(y.Start) })
	return runs, nil
}

// readBatch fills b with the batch run's status and, once it completed, what the message
// came to in its result.
func readBatch(ctx context.Context, a *app.App, b *batchView, messageID uuid.UUID) error {
	c, err := app.Dial(ctx, a.Config)
	if err != nil {
		return err
	}
	defer c.Close()
	desc, err := c.DescribeWorkflowExecution(ctx, b.WorkflowID, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return nil // past the namespace's retention
	case err != nil:
		return fmt.Errorf("describe batch %s: %w", b.WorkflowID, err)
	}
	info := desc.GetWorkflowExecutionInfo()
	b.RunID, b.Status = info.GetExecution().GetRunId(), statusName(info.GetStatus())
	b.URL = workflowURL(a, b.WorkflowID, b.RunID)
	if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		return nil
	}
	var res workflows.BatchResult
	if err := c.GetWorkflow(ctx, b.WorkflowID, b.RunID).Get(ctx, &res); err != nil {
		return fmt.Errorf("read the result of batch %s: %w", b.WorkflowID, err)
	}
	for _, o := range res.Outcomes {
		if o.MessageID == messageID.String() {
			b.Outcome, b.Error = string(o.Outcome), o.Error
		}
	}
	return nil
}

// statusName is the status as the Temporal UI writes it: Running, Completed, Failed,
// ContinuedAsNew...
func statusName(s enumspb.WorkflowExecutionStatus) string {
	var b strings.Builder
	for _, word := range strings.Split(strings.TrimPrefix(s.String(), "WORKFLOW_EXECUTION_STATUS_"), "_") {
		if word != "" {
			b.WriteString(word[:1] + strings.ToLower(word[1:]))
		}
	}
	return b.String()
}

// runAttempts lists the activities a run's history records: each local activity's marker
// and each scheduled activity or Nexus operation with its outcome, in history order.
func runAttempts(ctx context.Context, c client.Client, dc converter.DataConverter, fc converter.FailureConverter, workflowID, runID string) ([]attemptView, error) {
	out := []attemptView{}
	count := map[string]int{}
	scheduled := map[int64]int{} // scheduled event ID -> index in out
	iter := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			return out, fmt.Errorf("read history of %s run %s: %w", workflowID, runID, err)
		}
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			m := ev.GetMarkerRecordedEventAttributes()
			if m.GetMarkerName() != "LocalActivity" {
				continue
			}
			var data struct {
				ActivityType string `json:"ActivityType"`
			}
			if err := dc.FromPayloads(m.GetDetails()["data"], &data); err != nil || data.ActivityType == "" {
				data.ActivityType = "(local activity)"
			}
			count[data.ActivityType]++
			a := attemptView{Activity: data.ActivityType, Attempt: count[data.ActivityType], Local: true, At: at, Outcome: "ok"}
			if f := m.GetFailure(); f != nil {
				a.Outcome, a.Error = "failed", failureText(fc, f)
			}
			out = append(out, a)
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			name := ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()
			count[name]++
			scheduled[ev.GetEventId()] = len(out)
			out = append(out, attemptView{Activity: name, Attempt: count[name], At: at, Outcome: "running"})
		case enumspb.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED:
			// A Nexus topic's attempt or check: one operation of the team's service.
			n := ev.GetNexusOperationScheduledEventAttributes()
			name := n.GetEndpoint() + "/" + n.GetService() + "/" + n.GetOperation()
			count[name]++
			scheduled[ev.GetEventId()] = len(out)
			out = append(out, attemptView{Activity: name, Attempt: count[name], Nexus: true, At: at, Outcome: "running"})
		default:
			setOutcome(out, scheduled, ev, fc)
		}
	}
	return out, nil
}

// setOutcome records the end of a scheduled activity or Nexus operation.
func setOutcome(out []attemptView, scheduled map[int64]int, ev *historypb.HistoryEvent, fc converter.FailureConverter) {
	var id int64
	outcome, errText := "", ""
	switch ev.GetEventType() {
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
		id, outcome = ev.GetActivityTaskCompletedEventAttributes().GetScheduledEventId(), "ok"
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED:
		a := ev.GetActivityTaskFailedEventAttributes()
		id, outcome, errText = a.GetScheduledEventId(), "failed", failureText(fc, a.GetFailure())
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
		a := ev.GetActivityTaskTimedOutEventAttributes()
		id, outcome, errText = a.GetScheduledEventId(), "timed out", failureText(fc, a.GetFailure())
	case enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
		id, outcome = ev.GetActivityTaskCanceledEventAttributes().GetScheduledEventId(), "canceled"
	case enumspb.EVENT_TYPE_NEXUS_OPERATION_COMPLETED:
		id, outcome = ev.GetNexusOperationCompletedEventAttributes().GetScheduledEventId(), "ok"
	case enumspb.EVENT_TYPE_NEXUS_OPERATION_FAILED:
		a := ev.GetNexusOperationFailedEventAttributes()
		id, outcome, errText = a.GetScheduledEventId(), "failed", failureText(fc, a.GetFailure())
	case enumspb.EVENT_TYPE_NEXUS_OPERATION_TIMED_OUT:
		a := ev.GetNexusOperationTimedOutEventAttributes()
		id, outcome, errText = a.GetScheduledEventId(), "timed out", failureText(fc, a.GetFailure())
	case enumspb.EVENT_TYPE_NEXUS_OPERATION_CANCELED:
		id, outcome = ev.GetNexusOperationCanceledEventAttributes().GetScheduledEventId(), "canceled"
	default:
		return
	}
	if i, ok := scheduled[id]; ok {
		out[i].Outcome, out[i].Error = outcome, errText
	}
}

// failureText is a failure's message, decoded when a payload codec encoded it.
func failureText(fc converter.FailureConverter, f *failurepb.Failure) string {
	if f == nil {
		return ""
	}
	err := fc.FailureToError(f)
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Message()
	}
	if err != nil {
		return err.Error()
	}
	return f.GetMessage()
}

// waitsFor says what a message not yet sent waits for, after its status: the resume of
// its paused topic, an earlier message of its key, or room under its topic's limit of
// messages in flight. Empty for any other message.
func (v *messageView) waitsFor() string {
	switch v.Status {
	case store.StatusPending, store.StatusClaimed, store.StatusDispatched:
	default:
		return ""
	}
	switch {
	case v.Paused && v.Status == store.StatusDispatched && v.Batch != nil && len(v.Runs) == 0:
		// A batch run already started finishes its batch, pause or not; a message it
		// handed to a run of its own (Runs) waits in that run.
		return ""
	case v.Paused:
		return fmt.Sprintf(", topic paused: waits for outbox topic resume %s", v.Topic)
	case !v.HeldBack || v.Status == store.StatusDispatched:
		return ""
	case v.OrderingKey != nil:
		return fmt.Sprintf(", held back: waits for an earlier message of ordering key %s", *v.OrderingKey)
	default:
		return ", waiting for room: its topic is at its limit of messages in flight (max_in_flight); the relay starts it as earlier ones finish"
	}
}

func (v *messageView) write(w io.Writer) {
	const layout = "2006-01-02 15:04:05.000"
	fmt.Fprintf(w, "Message      %s\nTopic        %s\n", v.MessageID, v.Topic)
	if v.rowMissing {
		fmt.Fprintln(w, "Status       (no row: removed by retention or discarded)")
	} else {
		status := string(v.Status) + v.waitsFor()
		fmt.Fprintf(w, "Status       %s\nCreated      %s\n", status, v.CreatedAt.Local().Format(layout))
		if v.SentAt != nil {
			fmt.Fprintf(w, "Sent         %s\n", v.SentAt.Local().Format(layout))
		}
		retries := fmt.Sprint(v.RetryTimes)
		if v.MaxRetryTimes != nil {
			retries += fmt.Sprintf(" of at most %d", *v.MaxRetryTimes)
		}
		fmt.Fprintf(w, "Retries      %s\nRedrives     %d\n", retries, v.RedriveCount)
		if v.NextRetryAt != nil && (v.Status == store.StatusPending || v.Status == store.StatusClaimed) {
			// The time before which no relay hands it over; once handed over, its run
			// times its attempts, and a dead or discarded message has none until a redrive.
			fmt.Fprintf(w, "Next attempt %s\n", v.NextRetryAt.Local().Format(layout))
		}
		writeOrderingKey(w, v.OrderingKey, v.OrderingSeq)
		if v.LastError != nil {
			fmt.Fprintf(w, "Last error   %s\n", *v.LastError)
		}
		writePayload(w, v.Payload)
	}
	if b := v.Batch; b != nil {
		line := b.WorkflowID
		if b.Status != "" {
			line += "  " + b.Status
		}
		if b.Outcome != "" {
			line += ", the message " + strings.ReplaceAll(b.Outcome, "_", " ")
			if b.Error != "" {
				line += " after: " + truncate(b.Error, 200)
			}
		}
		fmt.Fprintf(w, "\nBatch        %s\n  %s\n", line, b.URL)
	}
	switch {
	case v.HistoryError != "":
		fmt.Fprintf(w, "\nAttempts: the workflow history could not be read: %s\n", v.HistoryError)
	case len(v.Runs) == 0 && v.Batch != nil:
		fmt.Fprintln(w, "\nNo run of its own: its batch delivers it (a message leaves the batch for a run of its own only after a failed attempt).")
	case len(v.Runs) == 0:
		fmt.Fprintln(w, "\nNo workflow run yet (the relay starts one when the row is due).")
	}
	for i, r := range v.Runs {
		fmt.Fprintf(w, "\nRun %d of %d  %s  started %s\n  %s\n", i+1, len(v.Runs), r.Status, r.Start.Local().Format(layout), r.URL)
		for _, a := range r.Attempts {
			kind := "activity"
			switch {
			case a.Local:
				kind = "local"
			case a.Nexus:
				kind = "nexus"
			}
			line := fmt.Sprintf("  %s  %-22s #%-2d %-8s %s", a.At.Local().Format(layout), a.Activity, a.Attempt, kind, a.Outcome)
			if a.Error != "" {
				line += ": " + truncate(a.Error, 200)
			}
			fmt.Fprintln(w, line)
		}
	}
	writeDeadLetters(w, v.DeadLetters, layout)
	writeAudit(w, v.Audit, layout)
}

// writeOrderingKey writes a message's ordering key and its place in the key, if it has a
// key. A row given its key by an UPDATE, after the insert that numbers keyed rows, has no
// place.
func writeOrderingKey(w io.Writer, key *string, seq *int64) {
	switch {
	case key == nil:
	case seq == nil:
		fmt.Fprintf(w, "Ordering key %s\n", *key)
	default:
		fmt.Fprintf(w, "Ordering key %s (message %d of the key)\n", *key, *seq)
	}
}

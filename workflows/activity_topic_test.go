package workflows_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/workflows"
)

// A team's activities, as its worker registers them.
func reserveStock(context.Context, delivery.Message) error           { return nil }
func hasReservation(context.Context, delivery.Message) (bool, error) { return false, nil }
func loadMessage(context.Context, workflows.LoadMessageInput) (workflows.LoadMessageResult, error) {
	return workflows.LoadMessageResult{}, nil
}
func recordFailure(context.Context, workflows.RecordFailureInput) error { return nil }

// activitySetup is setup for a topic delivered by the team's ReserveStock on the
// inventory task queue.
func activitySetup(t *testing.T, check string) *bundle {
	t.Helper()
	b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute,
		Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory", CheckActivity: check}})
	b.env.RegisterActivityWithOptions(reserveStock, activity.RegisterOptions{Name: "ReserveStock"})
	b.env.RegisterActivityWithOptions(hasReservation, activity.RegisterOptions{Name: "HasReservation"})
	b.env.RegisterActivityWithOptions(loadMessage, activity.RegisterOptions{Name: workflows.ActivityLoadMessage})
	b.env.RegisterActivityWithOptions(recordFailure, activity.RegisterOptions{Name: workflows.ActivityRecordFailure})
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, workflows.LoadMessageInput{MessageID: b.input.MessageID}).Return(workflows.LoadMessageResult{
		Message: delivery.Message{MessageID: b.input.MessageID, Topic: b.input.Topic, Payload: json.RawMessage(`{"order_id": 42}`), CreatedAt: created},
	}, nil).Once() // once per run, whatever the attempts
	return b
}

// onReserve answers ReserveStock's attempts in order with errs (nil = done) and checks
// the message each attempt gets.
func (b *bundle) onReserve(t *testing.T, errs ...error) {
	n := 0
	b.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(func(ctx context.Context, m delivery.Message) error {
		require.Equal(t, "inventory", activity.GetInfo(ctx).TaskQueue)
		require.Equal(t, b.input.MessageID, m.MessageID)
		require.JSONEq(t, `{"order_id": 42}`, string(m.Payload))
		require.Equal(t, n+1, m.Attempt)
		require.Equal(t, 3, m.MaxAttempts)
		b.sends = append(b.sends, b.env.Now())
		err := errs[n]
		n++
		return err
	}).Times(len(errs))
}

func TestActivityTopic(t *testing.T) {
	t.Parallel()

	t.Run("UnansweredCheckIsAskedAgainAfterACleanFailure", func(t *testing.T) {
		t.Parallel()
		// The team's worker did attempt 1's work and died before it answered (a timeout);
		// the check finds no worker, nor does attempt 2. Once the worker is back, the
		// check runs before attempt 3 and finds the reservation: nothing is sent again.
		b := activitySetup(t, "HasReservation")
		answers := []error{
			temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil),
			temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil),
			nil, // a third attempt would reserve the stock again
		}
		b.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(func(context.Context, delivery.Message) error {
			b.sends = append(b.sends, b.env.Now())
			return answers[len(b.sends)-1]
		})
		checks := 0
		b.env.OnActivity("HasReservation", mock.Anything, mock.Anything).Return(func(context.Context, delivery.Message) (bool, error) {
			checks++
			if checks == 1 {
				return false, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)
			}
			return true, nil
		}).Twice()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.True(t, res.AlreadyProcessed)
		require.Len(t, b.sends, 2, "no third attempt")
	})

	t.Run("DeliveredOnTheTeamsTaskQueue", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "")
		b.onReserve(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
	})

	t.Run("ARetryableErrorWaitsItsNextRetryDelay", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "")
		b.onReserve(t,
			temporal.NewApplicationErrorWithOptions("stock service busy", "Busy", temporal.ApplicationErrorOptions{NextRetryDelay: 20 * time.Second}),
			errors.New("plain error: the policy's backoff"),
			nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3, TeamAttempt: true}).Return(nil).Once()
		// Each failed attempt is recorded on the row, as the send activity records its own.
		b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, workflows.RecordFailureInput{
			MessageID: b.input.MessageID, Topic: b.input.Topic, Attempt: 1, Error: "stock service busy", ErrType: workflows.ErrTypeRetryable}).Return(nil).Once()
		b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, workflows.RecordFailureInput{
			MessageID: b.input.MessageID, Topic: b.input.Topic, Attempt: 2, Error: "plain error: the policy's backoff", ErrType: workflows.ErrTypeRetryable}).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
		require.Len(t, b.sends, 3)
		require.Equal(t, 20*time.Second, b.sends[1].Sub(b.sends[0]).Round(time.Second))
		require.Equal(t, 2*time.Second, b.sends[2].Sub(b.sends[1]).Round(time.Second), "the second failure waits the backoff of attempt 2")
	})

	t.Run("ANonRetryableErrorDeadLetters", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "HasReservation")
		b.onReserve(t, temporal.NewNonRetryableApplicationError("no such SKU", "UnknownSKU", nil))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == "permanent failure: no such SKU"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("ATimeoutIsCheckedBeforeAResend", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "HasReservation")
		b.onReserve(t, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil))
		b.env.OnActivity("HasReservation", mock.Anything, mock.Anything).Return(func(ctx context.Context, m delivery.Message) (bool, error) {
			require.Equal(t, "inventory", activity.GetInfo(ctx).TaskQueue)
			require.Equal(t, b.input.MessageID, m.MessageID)
			return true, nil
		}).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, AlreadyProcessed: true}, res)
	})

	t.Run("NoWorkerPollingIsRetried", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "HasReservation")
		b.onReserve(t, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil), nil)
		// Nothing ran, so no check before the second attempt.
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 2, TeamAttempt: true}).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
	})

	t.Run("GivingUpNamesTheLastError", func(t *testing.T) {
		t.Parallel()
		b := activitySetup(t, "")
		b.onReserve(t, errors.New("stock db down"), errors.New("stock db down"), errors.New("stock db still down"))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 3 && in.LastError == "gave up after 3 attempts: stock db still down"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})
}

func TestActivityHandlerJSON(t *testing.T) {
	t.Parallel()
	in := workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute, SendTimeout: 30 * time.Second,
		Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory", StartToClose: 30 * time.Second, ScheduleToStart: 5 * time.Minute, CheckActivity: "HasReservation"}}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.Contains(t, string(b), `"activity":{"activity":"ReserveStock","task_queue":"inventory","start_to_close":"30s","schedule_to_start":"5m0s","check_activity":"HasReservation"}`)
	var back workflows.Policy
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, in, back)
}

func TestWorkflowTopic(t *testing.T) {
	t.Parallel()
	setupWorkflowTopic := func(t *testing.T, payload string) *bundle {
		b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute,
			Workflow: &workflows.WorkflowHandler{Workflow: "FulfilOrder", TaskQueue: "fulfilment", WorkflowID: "fulfil-{payload.order_id}"}})
		b.env.RegisterActivityWithOptions(loadMessage, activity.RegisterOptions{Name: workflows.ActivityLoadMessage})
		b.env.RegisterActivityWithOptions(recordFailure, activity.RegisterOptions{Name: workflows.ActivityRecordFailure})
		b.env.RegisterActivityWithOptions(func(context.Context, workflows.SignalWithStartInput) (workflows.StartedWorkflow, error) {
			return workflows.StartedWorkflow{}, nil
		}, activity.RegisterOptions{Name: workflows.ActivitySignalWithStart})
		b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, workflows.LoadMessageInput{MessageID: b.input.MessageID}).Return(workflows.LoadMessageResult{
			Message: delivery.Message{MessageID: b.input.MessageID, Topic: b.input.Topic, Payload: json.RawMessage(payload)},
		}, nil).Once()
		return b
	}

	t.Run("StartsTheTeamsWorkflowOnce", func(t *testing.T) {
		t.Parallel()
		b := setupWorkflowTopic(t, `{"order_id": 42}`)
		var started []string
		b.env.RegisterWorkflowWithOptions(func(ctx workflow.Context, m delivery.Message) error {
			info := workflow.GetInfo(ctx)
			started = append(started, info.WorkflowExecution.ID+"@"+info.TaskQueueName)
			require.Equal(t, b.input.MessageID, m.MessageID)
			require.Equal(t, 1, m.Attempt)
			return nil
		}, workflow.RegisterOptions{Name: "FulfilOrder"})
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, []string{"fulfil-42@fulfilment"}, started)
		require.NotNil(t, res.Started)
		require.Equal(t, "fulfil-42", res.Started.WorkflowID)
		require.NotEmpty(t, res.Started.RunID)
	})

	t.Run("SignalsThroughTheSignalActivity", func(t *testing.T) {
		t.Parallel()
		b := setupWorkflowTopic(t, `{"order_id": 42}`)
		b.input.Policy.Workflow.Signal = "paid"
		b.env.OnActivity(workflows.ActivitySignalWithStart, mock.Anything, mock.MatchedBy(func(in workflows.SignalWithStartInput) bool {
			return in.WorkflowID == "fulfil-42" && in.Workflow == "FulfilOrder" && in.TaskQueue == "fulfilment" && in.Signal == "paid" &&
				in.IDReuse == "allow_duplicate" && in.Message.MessageID == b.input.MessageID && in.Message.Attempt == 1
		})).Return(workflows.StartedWorkflow{WorkflowID: "fulfil-42", RunID: "r-1"}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, &workflows.StartedWorkflow{WorkflowID: "fulfil-42", RunID: "r-1"}, res.Started)
	})

	// A run handed a message an earlier run may have signalled tells the signal
	// activity, which then looks for that signal before it sends one.
	t.Run("ASignalThatMayHaveBeenSentIsLookedFor", func(t *testing.T) {
		t.Parallel()
		b := setupWorkflowTopic(t, `{"order_id": 42}`)
		b.input.Policy.Workflow.Signal = "paid"
		b.input.CheckFirst = true
		b.env.OnActivity(workflows.ActivitySignalWithStart, mock.Anything, mock.MatchedBy(func(in workflows.SignalWithStartInput) bool {
			return in.Message.Attempt == 1 && in.MayHaveBeenSent
		})).Return(workflows.StartedWorkflow{WorkflowID: "fulfil-42", RunID: "r-1"}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
	})

	// An ID that no start can give the team's workflow fails for good, with what is
	// wrong: one over Temporal's length limit (whose start would fail the workflow task
	// forever), and the delivery run's own (whose start would find it running and count
	// the message delivered), for a start and for a signal-with-start.
	for _, c := range []struct {
		name, payload, signal, want string
	}{
		{"AnIDOverTemporalsLimit", `{"order_id": "` + strings.Repeat("a", 1000) + `"}`, "",
			`renders an ID of 1007 bytes, over Temporal's limit of 1000`},
		{"TheRunsOwnID", `{"order_id": 42, "ref": "outbox-0195c2a0-0000-7000-8000-000000000001"}`, "",
			`renders outbox-0195c2a0-0000-7000-8000-000000000001, the ID of the outbox's own delivery run`},
		{"TheRunsOwnIDSignalled", `{"order_id": 42, "ref": "outbox-0195c2a0-0000-7000-8000-000000000001"}`, "paid",
			`the ID of the outbox's own delivery run`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupWorkflowTopic(t, c.payload)
			if strings.Contains(c.payload, "ref") {
				b.input.Policy.Workflow.WorkflowID = "{payload.ref}"
			}
			b.input.Policy.Workflow.Signal = c.signal
			b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: workflows.WorkflowID(b.input.MessageID)})
			b.env.RegisterWorkflowWithOptions(func(workflow.Context, delivery.Message) error {
				t.Error("the team's workflow started")
				return nil
			}, workflow.RegisterOptions{Name: "FulfilOrder"})
			b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
				return in.Attempts == 1 && strings.HasPrefix(in.LastError, "permanent failure: workflow_id template") && strings.Contains(in.LastError, c.want)
			})).Return(nil).Once()
			_, err := b.run()
			requireDeadLettered(t, err)
		})
	}

	t.Run("AMissingPayloadFieldDeadLetters", func(t *testing.T) {
		t.Parallel()
		b := setupWorkflowTopic(t, `{"sku": "SKU-1"}`)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && strings.Contains(in.LastError, "permanent failure: workflow_id template \"fulfil-{payload.order_id}\": the payload of message") &&
				strings.HasSuffix(in.LastError, "has no field order_id")
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})
}

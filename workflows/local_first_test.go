package workflows_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/workflows"
)

// kinds records, per activity name, how each execution ran: "local" or "regular".
type kinds map[string][]string

// localSetup is setup for a run of the current DeliveryVersion started as the relay starts
// it: with the workflow task timeout the policy's first attempt needs.
func localSetup(t *testing.T, policy workflows.Policy) (*bundle, kinds) {
	t.Helper()
	b := setup(t, policy)
	b.input.Version = workflows.DeliveryVersion
	timeout := workflows.DefaultWorkflowTaskTimeout
	if b.input.LocalFirstAttempt() {
		timeout = workflows.FirstTaskTimeout(b.input.Policy.WithDefaults().SendTimeout)
	}
	b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{WorkflowTaskTimeout: timeout})
	k := kinds{}
	b.env.SetOnLocalActivityStartedListener(func(info *activity.Info, _ context.Context, _ []any) {
		k[info.ActivityType.Name] = append(k[info.ActivityType.Name], "local")
	})
	b.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		k[info.ActivityType.Name] = append(k[info.ActivityType.Name], "regular")
	})
	return b, k
}

// onSendResults answers the send attempts in order: a nil error is a delivery whose row
// the send recorded.
func (b *bundle) onSendResults(t *testing.T, errs ...error) {
	n := 0
	b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.SendInput) (workflows.SendResult, error) {
		require.Equal(t, n+1, in.Attempt)
		b.sends = append(b.sends, b.env.Now())
		err := errs[n]
		n++
		return workflows.SendResult{Recorded: err == nil}, err
	}).Times(len(errs))
}

func TestLocalFirstAttempt(t *testing.T) {
	t.Parallel()
	policy := workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, MaxInterval: time.Minute}

	t.Run("DeliveredAndRecordedInTheFirstTask", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, policy)
		b.onSendResults(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Never()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
		require.Equal(t, kinds{workflows.ActivitySend: {"local"}}, k, "one local send, and no mark-sent: the send recorded the row")
	})

	t.Run("UnrecordedDeliveryIsMarkedInTheSameTask", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, policy)
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(workflows.SendResult{}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
		require.Equal(t, kinds{workflows.ActivitySend: {"local"}, workflows.ActivityMarkSent: {"local"}}, k)
	})

	t.Run("RetriesAreRegularActivitiesAfterTheBackoff", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, policy)
		b.onSendResults(t, retryable("HTTP 503"), nil)
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempts)
		require.Equal(t, kinds{workflows.ActivitySend: {"local", "regular"}}, k)
		require.GreaterOrEqual(t, b.sends[1].Sub(b.sends[0]), time.Second, "the topic's backoff")
	})

	t.Run("AmbiguousLocalAttemptIsCheckedBeforeTheResend", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, policy)
		b.onSendResults(t, temporal.NewTimeoutError(0, nil), nil)
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true}, nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempts)
		require.Equal(t, kinds{workflows.ActivitySend: {"local", "regular"}, workflows.ActivityCheckProcessed: {"regular"}}, k)
	})

	t.Run("AmbiguousLocalAttemptFoundProcessedIsNotResent", func(t *testing.T) {
		t.Parallel()
		b, _ := localSetup(t, policy)
		b.onSendResults(t, ambiguous("connection reset"))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: true}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, AlreadyProcessed: true}, res)
	})

	t.Run("DatabaseUnavailableRetriesTheSameAttemptAsARegularActivity", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, workflows.Policy{MaxAttempts: 1})
		calls := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.SendInput) (workflows.SendResult, error) {
			calls++
			require.Equal(t, 1, in.Attempt, "no attempt used up")
			if calls <= 3 {
				return workflows.SendResult{}, storeUnavailable()
			}
			return workflows.SendResult{Recorded: true}, nil
		}).Times(4)
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
		require.Equal(t, kinds{workflows.ActivitySend: {"local", "regular", "regular", "regular"}}, k)
	})

	t.Run("FirstTaskTriedBeforeChecksAndSendsRegularly", func(t *testing.T) {
		t.Parallel()
		// The first workflow task's earlier try timed out (its worker was lost mid-send):
		// WorkflowTaskTimedOut, WorkflowTaskScheduled and WorkflowTaskStarted come before
		// this try, which starts at event 6.
		b, k := localSetup(t, policy)
		b.env.SetCurrentHistoryLength(6)
		b.onSendResults(t, nil)
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true}, nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
		require.Equal(t, kinds{workflows.ActivityCheckProcessed: {"regular"}, workflows.ActivitySend: {"regular"}}, k)
	})

	t.Run("FirstTaskTriedBeforeWithTheMessageAlreadyProcessed", func(t *testing.T) {
		t.Parallel()
		b, k := localSetup(t, policy)
		b.env.SetCurrentHistoryLength(6)
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: true}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 0}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{AlreadyProcessed: true}, res)
		require.Empty(t, k[workflows.ActivitySend], "not sent again")
	})

	for _, tc := range []struct {
		name   string
		adjust func(b *bundle)
	}{
		{"FirstAttemptActivity", func(b *bundle) { b.input.Policy.FirstAttempt = workflows.FirstAttemptActivity }},
		{"CheckFirst", func(b *bundle) { b.input.CheckFirst = true }},
		{"Version3", func(b *bundle) { b.input.Version = 3 }},
		{"TaskTimeoutTooShortForTheSend", func(b *bundle) {
			// A run started without FirstTaskTimeout: 10s leaves no room for a 30s send.
			b.env.SetStartWorkflowOptions(client.StartWorkflowOptions{WorkflowTaskTimeout: workflows.DefaultWorkflowTaskTimeout})
		}},
	} {
		t.Run("RegularWith"+tc.name, func(t *testing.T) {
			t.Parallel()
			b, k := localSetup(t, policy)
			tc.adjust(b)
			b.onSendResults(t, nil)
			b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(workflows.CheckProcessedResult{}, nil).Maybe()
			b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Maybe()
			res, err := b.run()
			require.NoError(t, err)
			require.Equal(t, 1, res.Attempts)
			require.Equal(t, []string{"regular"}, k[workflows.ActivitySend])
			if b.input.Version < 4 {
				require.Equal(t, []string{"local"}, k[workflows.ActivityMarkSent], "version 3 marks the row sent in a step of its own")
			} else {
				require.Empty(t, k[workflows.ActivityMarkSent], "the send recorded the row")
			}
		})
	}
}

func TestFirstTaskTimeout(t *testing.T) {
	t.Parallel()
	require.Equal(t, workflows.DefaultWorkflowTaskTimeout, workflows.FirstTaskTimeout(time.Second))
	require.Equal(t, 42500*time.Millisecond, workflows.FirstTaskTimeout(workflows.DefaultSendTimeout))
	// The longest local send still fits the server's cap on workflow task timeouts.
	require.LessOrEqual(t, workflows.FirstTaskTimeout(workflows.MaxLocalSendTimeout), 2*time.Minute)

	require.True(t, workflows.Policy{}.LocalFirstAttempt(), "the default policy sends its first attempt locally")
	require.True(t, workflows.Policy{SendTimeout: workflows.MaxLocalSendTimeout}.LocalFirstAttempt())
	require.False(t, workflows.Policy{SendTimeout: workflows.MaxLocalSendTimeout + time.Second}.LocalFirstAttempt())
	require.False(t, workflows.Policy{FirstAttempt: workflows.FirstAttemptActivity}.LocalFirstAttempt())
	require.False(t, workflows.Policy{Activity: &workflows.ActivityHandler{Activity: "A", TaskQueue: "q"}}.LocalFirstAttempt())
	require.False(t, workflows.Policy{Workflow: &workflows.WorkflowHandler{Workflow: "W", TaskQueue: "q"}}.LocalFirstAttempt())

	err := workflows.Policy{FirstAttempt: "eager"}.WithDefaults().Validate()
	require.EqualError(t, err, `first_attempt must be local or activity, got "eager"`)
}

// TestTeamTopicMessageFromTheInput: a run whose input carries the message (the relay read
// it with the claim) gives it to the team's activity without a load step: the start, the
// team's activity and mark-sent.
func TestTeamTopicMessageFromTheInput(t *testing.T) {
	t.Parallel()
	b, k := localSetup(t, workflows.Policy{MaxAttempts: 3,
		Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory"}})
	b.env.RegisterActivityWithOptions(reserveStock, activity.RegisterOptions{Name: "ReserveStock"})
	b.env.RegisterActivityWithOptions(loadMessage, activity.RegisterOptions{Name: workflows.ActivityLoadMessage})
	b.input.Message = &delivery.Message{MessageID: b.input.MessageID, Topic: b.input.Topic, Payload: json.RawMessage(`{"order_id": 42}`)}
	b.onReserve(t, nil)
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
	res, err := b.run()
	require.NoError(t, err)
	require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
	require.Equal(t, kinds{"ReserveStock": {"regular"}, workflows.ActivityMarkSent: {"local"}}, k, "no load step")
}

// TestNewerVersionIsLeftForANewerWorker: a run started at a version this code does not
// know fails its workflow task (a panic) before any step, so a worker that runs it takes
// the task.
func TestNewerVersionIsLeftForANewerWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, workflows.Policy{})
	b.input.Version = workflows.DeliveryVersion + 1
	_, err := b.run()
	var panicErr *temporal.PanicError
	require.ErrorAs(t, err, &panicErr)
	require.Contains(t, panicErr.Error(), "upgrade the workers before the relays")
}

// TestTeamTopicMessageFromTheInputHasItsOrderingKey: the message a team gets from the
// run's input carries its ordering key, as a loaded one does, also from a relay that put
// the key in the input only.
func TestTeamTopicMessageFromTheInputHasItsOrderingKey(t *testing.T) {
	t.Parallel()
	b, _ := localSetup(t, workflows.Policy{MaxAttempts: 3,
		Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory"}})
	b.env.RegisterActivityWithOptions(reserveStock, activity.RegisterOptions{Name: "ReserveStock"})
	b.input.Message = &delivery.Message{MessageID: b.input.MessageID, Topic: b.input.Topic, Payload: json.RawMessage(`{"order_id": 42}`)}
	b.input.OrderingKey = "order-42"
	var got string
	b.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(func(_ context.Context, m delivery.Message) error {
		got = m.OrderingKey
		return nil
	}).Once()
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
	_, err := b.run()
	require.NoError(t, err)
	require.Equal(t, "order-42", got)
}

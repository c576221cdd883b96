package workflows_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nexus-rpc/sdk-go/nexus"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamnexus"
	"github.com/outbox-go/outbox/workflows"
)

// nexusTeam serves a topic's operations as a team's worker does, through
// teamnexus.Operation and teamnexus.CheckOperation: each attempt answers the next of
// answers (nil = done), the check answers processed.
type nexusTeam struct {
	mu        sync.Mutex
	answers   []error
	attempts  []int
	at        []time.Time
	now       func() time.Time
	processed bool
	checks    int
}

func (n *nexusTeam) Send(_ context.Context, m delivery.Message) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attempts = append(n.attempts, m.Attempt)
	n.at = append(n.at, n.now())
	err := n.answers[0]
	n.answers = n.answers[1:]
	return err
}

func (n *nexusTeam) CheckProcessed(context.Context, delivery.Message) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.checks++
	return n.processed, nil
}

// nexusSetup is setup for a topic delivered by operation deliver of service orders through
// endpoint orders-endpoint, its message in the input as the relay starts such runs.
func nexusSetup(t *testing.T, check string, answers ...error) (*bundle, *nexusTeam) {
	t.Helper()
	b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute,
		Nexus: &workflows.NexusHandler{Endpoint: "orders-endpoint", Service: "orders", Operation: "deliver", CheckOperation: check}})
	b.input.Version = workflows.DeliveryVersion
	b.input.Message = &delivery.Message{MessageID: b.input.MessageID, Topic: b.input.Topic, Payload: json.RawMessage(`{"order_id": 42}`)}
	team := &nexusTeam{answers: answers, now: b.env.Now}
	svc := nexus.NewService("orders")
	require.NoError(t, svc.Register(teamnexus.Operation("deliver", team), teamnexus.CheckOperation("delivered", team)))
	b.env.RegisterNexusService(svc)
	b.env.RegisterActivityWithOptions(loadMessage, activity.RegisterOptions{Name: workflows.ActivityLoadMessage})
	b.env.RegisterActivityWithOptions(recordFailure, activity.RegisterOptions{Name: workflows.ActivityRecordFailure})
	return b, team
}

// TestNexusTopic: a topic delivered by a team's Nexus operation reads the operation's
// failures as a team activity's: a retryable one waits its Retry-After and is recorded on
// the row, a permanent one dead-letters, an ambiguous one asks the check operation first.
func TestNexusTopic(t *testing.T) {
	t.Parallel()

	t.Run("Delivered", func(t *testing.T) {
		t.Parallel()
		b, team := nexusSetup(t, "", nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1, TeamAttempt: true}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
		require.Equal(t, []int{1}, team.attempts)
	})

	t.Run("ARetryableErrorWaitsItsRetryAfter", func(t *testing.T) {
		t.Parallel()
		b, team := nexusSetup(t, "delivered", delivery.Retryable(errors.New("orders service busy"), 20*time.Second), nil)
		b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, workflows.RecordFailureInput{
			MessageID: b.input.MessageID, Topic: b.input.Topic, Attempt: 1, Error: "orders service busy", ErrType: workflows.ErrTypeRetryable}).Return(nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 2, TeamAttempt: true}).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
		require.Equal(t, []int{1, 2}, team.attempts)
		require.Equal(t, 20*time.Second, team.at[1].Sub(team.at[0]).Round(time.Second))
		require.Zero(t, team.checks, "a retryable failure sent nothing: no check")
	})

	t.Run("APermanentErrorDeadLetters", func(t *testing.T) {
		t.Parallel()
		b, team := nexusSetup(t, "delivered", delivery.Permanent(errors.New("order 42 does not exist")))
		b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.Anything).Return(nil).Once()
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == "permanent failure: order 42 does not exist"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
		require.Equal(t, []int{1}, team.attempts)
	})

	t.Run("AnAmbiguousErrorIsCheckedBeforeAResend", func(t *testing.T) {
		t.Parallel()
		b, team := nexusSetup(t, "delivered", errors.New("connection reset after the write"))
		team.processed = true
		b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.MatchedBy(func(in workflows.RecordFailureInput) bool {
			return in.ErrType == workflows.ErrTypeAmbiguous
		})).Return(nil).Once()
		b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, mock.Anything).Return(workflows.LoadMessageResult{Message: *b.input.Message}, nil).Maybe()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, AlreadyProcessed: true}, res)
		require.Equal(t, 1, team.checks)
		require.Equal(t, []int{1}, team.attempts, "the check said processed: no resend")
	})
}

// TestNexusPolicy: a Nexus topic's settings are checked, and its timeout defaults to the
// topic's send timeout.
func TestNexusPolicy(t *testing.T) {
	t.Parallel()
	p := workflows.Policy{SendTimeout: 7 * time.Second, Nexus: &workflows.NexusHandler{Endpoint: "e", Service: "s", Operation: "o"}}.WithDefaults()
	require.Equal(t, 7*time.Second, p.Nexus.Timeout)
	require.NoError(t, p.Validate())
	require.False(t, p.LocalFirstAttempt(), "a team's operation is not a sink of the outbox's worker")
	require.True(t, p.DeliveredByTeam())

	bad := p
	bad.Nexus = &workflows.NexusHandler{Endpoint: "e", Service: "s", Timeout: time.Second}
	require.EqualError(t, bad.Validate(), "nexus.operation must name the operation of service s, got an empty name")
	bad.Activity = &workflows.ActivityHandler{Activity: "A", TaskQueue: "q"}
	require.EqualError(t, bad.WithDefaults().Validate(), "nexus and activity or workflow cannot both deliver a topic")

	raw, err := json.Marshal(p)
	require.NoError(t, err)
	var back workflows.Policy
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, p, back)
}

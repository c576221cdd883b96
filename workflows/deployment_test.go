package workflows_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/workflows"
)

const (
	deploymentA = "7d1f3c1e-4b6a-4f43-9a55-0d6c2f0b9a01"
	deploymentB = "c2a8e7f4-1d5b-4e39-8f6a-3b9d0e7c5a02"
)

func wrongDeployment() error {
	return temporal.NewApplicationError("message belongs to outbox deployment "+deploymentA+", this worker's is "+deploymentB,
		workflows.ErrTypeWrongDeployment)
}

// A send or check answered by a worker of another outbox database on the task queue uses
// no attempt and is never dead-lettered: the workflow asks again until a worker of its own
// deployment answers.
func TestDeliveryWrongDeployment(t *testing.T) {
	t.Parallel()

	t.Run("SendWaitsForItsOwnWorker", func(t *testing.T) {
		t.Parallel()
		// One attempt: a refusal that used it up would dead-letter the message.
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.input.Deployment = deploymentA
		calls := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(sendErrs(func(_ context.Context, in workflows.SendInput) error {
			calls++
			require.Equal(t, 1, in.Attempt)
			require.Equal(t, deploymentA, in.Deployment, "the send carries the message's deployment")
			if calls <= 4 {
				return wrongDeployment()
			}
			return nil
		})).Times(5)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Never()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
	})

	t.Run("CheckWaitsForItsOwnWorker", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.input.Deployment, b.input.CheckFirst = deploymentA, true
		calls := 0
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(
			func(_ context.Context, in workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
				calls++
				require.Equal(t, deploymentA, in.Deployment)
				if calls <= 4 { // more than the check's own retries
					return workflows.CheckProcessedResult{}, wrongDeployment()
				}
				return workflows.CheckProcessedResult{Supported: true, Processed: true}, nil
			}).Times(5)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 0}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{AlreadyProcessed: true}, res)
		require.Empty(t, b.sends, "not sent without an answer")
	})

	t.Run("TeamActivityErrorOfThatTypeIsTheTeams", func(t *testing.T) {
		t.Parallel()
		// Only the outbox's own send activity refuses a deployment; a team's activity on
		// its own task queue that failed with that type failed an attempt.
		b := activitySetup(t, "")
		b.input.Deployment = deploymentA
		b.onReserve(t, wrongDeployment(), wrongDeployment(), wrongDeployment())
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		var appErr *temporal.ApplicationError
		require.True(t, errors.As(err, &appErr))
		require.Equal(t, workflows.ErrTypeDeadLettered, appErr.Type())
	})
}

// DeliveryOf refuses a run of another deployment before any step: the workflow panics
// (on a real worker, a failed workflow task the server retries, possibly on the right
// worker), and no activity, local or not, runs.
func TestDeliveryOfRefusesAnotherDeployment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		deployment string
		refused    bool
	}{
		{"OwnDeployment", deploymentB, false},
		{"AnotherDeployment", deploymentA, true},
		{"NoDeploymentInInput", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, workflows.Policy{MaxAttempts: 1})
			b.env.RegisterWorkflowWithOptions(workflows.DeliveryOf(deploymentB), workflow.RegisterOptions{Name: "GuardedDelivery"})
			b.input.Deployment = tc.deployment
			if !tc.refused {
				b.onSend(t, nil)
				b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
			}
			b.env.ExecuteWorkflow("GuardedDelivery", b.input)
			require.True(t, b.env.IsWorkflowCompleted())
			err := b.env.GetWorkflowError()
			if !tc.refused {
				require.NoError(t, err)
				return
			}
			var panicErr *temporal.PanicError
			require.True(t, errors.As(err, &panicErr), "got %v", err)
			require.Contains(t, panicErr.Error(), workflows.ErrTypeWrongDeployment)
			require.Contains(t, panicErr.Error(), "a task queue belongs to one outbox database")
			require.Empty(t, b.sends)
		})
	}
}

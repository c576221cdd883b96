package workflows_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/workflows"
)

func purgeBatch(context.Context, workflows.RetentionInput) (workflows.PurgeBatchResult, error) {
	return workflows.PurgeBatchResult{}, nil
}

func setupRetention(t *testing.T) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(workflows.Retention, workflows.RetentionRegisterOptions())
	env.RegisterActivityWithOptions(purgeBatch, activity.RegisterOptions{Name: workflows.ActivityPurgeBatch})
	t.Cleanup(func() { env.AssertExpectations(t) })
	return env
}

// onPurge answers the batches in order with results and checks that each batch gets the
// input without the workflow-only fields.
func onPurge(t *testing.T, env *testsuite.TestWorkflowEnvironment, want workflows.RetentionInput, results ...workflows.PurgeBatchResult) {
	n := 0
	want.MaxBatches, want.Previous = 0, nil
	env.OnActivity(workflows.ActivityPurgeBatch, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.RetentionInput) (workflows.PurgeBatchResult, error) {
		require.Equal(t, want, in)
		res := results[n]
		n++
		return res, nil
	}).Times(len(results))
}

func TestRetention(t *testing.T) {
	t.Parallel()
	in := workflows.RetentionInput{SentAfter: 7 * 24 * time.Hour, DiscardedAfter: 30 * 24 * time.Hour, Archive: true, BatchSize: 1000}
	full := workflows.PurgeBatchResult{SentMessages: 1000, More: true}

	t.Run("LoopsUntilAShortBatch", func(t *testing.T) {
		t.Parallel()
		env := setupRetention(t)
		onPurge(t, env, in, full, full,
			workflows.PurgeBatchResult{SentMessages: 700, DiscardedMessages: 2, DeadLetters: 3, More: true},
			workflows.PurgeBatchResult{DeadLetters: 1})
		env.ExecuteWorkflow(workflows.RetentionWorkflowType, in)
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		var res workflows.RetentionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, workflows.RetentionResult{Batches: 4, SentMessages: 2700, DiscardedMessages: 2, DeadLetters: 4, Runs: 1}, res)
	})

	t.Run("NothingToRemoveIsOneBatch", func(t *testing.T) {
		t.Parallel()
		env := setupRetention(t)
		onPurge(t, env, in, workflows.PurgeBatchResult{})
		env.ExecuteWorkflow(workflows.RetentionWorkflowType, in)
		var res workflows.RetentionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, workflows.RetentionResult{Batches: 1, Runs: 1}, res)
	})

	t.Run("ContinuesAsNewAfterMaxBatches", func(t *testing.T) {
		t.Parallel()
		env := setupRetention(t)
		capped := in
		capped.MaxBatches = 3
		onPurge(t, env, capped, full, full, full)
		env.ExecuteWorkflow(workflows.RetentionWorkflowType, capped)
		require.True(t, env.IsWorkflowCompleted())
		var can *workflow.ContinueAsNewError
		require.ErrorAs(t, env.GetWorkflowError(), &can)
		require.Equal(t, workflows.RetentionWorkflowType, can.WorkflowType.Name)

		// The next run carries the counts so far and the same settings.
		next := capped
		next.Previous = &workflows.RetentionResult{Batches: 3, SentMessages: 3000, Runs: 1}
		env2 := setupRetention(t)
		onPurge(t, env2, capped, workflows.PurgeBatchResult{SentMessages: 5})
		env2.ExecuteWorkflow(workflows.RetentionWorkflowType, next)
		var res workflows.RetentionResult
		require.NoError(t, env2.GetWorkflowResult(&res))
		require.Equal(t, workflows.RetentionResult{Batches: 4, SentMessages: 3005, Runs: 2}, res)
	})

	t.Run("FailedBatchFailsTheRun", func(t *testing.T) {
		t.Parallel()
		env := setupRetention(t)
		env.OnActivity(workflows.ActivityPurgeBatch, mock.Anything, mock.Anything).
			Return(workflows.PurgeBatchResult{}, temporal.NewNonRetryableApplicationError("archive table missing", "test", nil)).Once()
		env.ExecuteWorkflow(workflows.RetentionWorkflowType, in)
		require.True(t, env.IsWorkflowCompleted())
		err := env.GetWorkflowError()
		require.ErrorContains(t, err, "purge batch 1")
		require.ErrorContains(t, err, "archive table missing")
	})

	t.Run("InvalidInputFailsWithoutBatches", func(t *testing.T) {
		t.Parallel()
		env := setupRetention(t)
		bad := in
		bad.BatchSize = 0
		env.ExecuteWorkflow(workflows.RetentionWorkflowType, bad)
		require.True(t, env.IsWorkflowCompleted())
		var appErr *temporal.ApplicationError
		require.True(t, errors.As(env.GetWorkflowError(), &appErr))
		require.Equal(t, workflows.ErrTypeInvalidRetention, appErr.Type())
		require.Contains(t, appErr.Error(), "batch_size must be at least 1, got 0")
	})
}

package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/workflows"
)

func sendBatch(context.Context, workflows.SendBatchInput) (workflows.SendBatchResult, error) {
	return workflows.SendBatchResult{}, nil
}
func markSentAll(context.Context, workflows.MarkSentAllInput) error { return nil }

// batchBundle runs OutboxBatch with mocked activities; the messages' own runs are mocked
// too, and record the inputs they were started with.
type batchBundle struct {
	env   *testsuite.TestWorkflowEnvironment
	input workflows.BatchInput
	mu    sync.Mutex
	runs  map[string]workflows.DeliveryInput
}

func setupBatch(t *testing.T, n int) *batchBundle {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(workflows.Batch, workflows.BatchRegisterOptions())
	env.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	env.RegisterActivityWithOptions(sendBatch, activity.RegisterOptions{Name: workflows.ActivitySendBatch})
	env.RegisterActivityWithOptions(markSentAll, activity.RegisterOptions{Name: workflows.ActivityMarkSentAll})
	b := &batchBundle{env: env, runs: map[string]workflows.DeliveryInput{}}
	retries := 0
	b.input = workflows.BatchInput{
		Topic:            "clicks",
		Policy:           workflows.Policy{MaxAttempts: 5, Batch: &workflows.BatchPolicy{Size: 100, Concurrency: 8}}.WithDefaults(),
		SearchAttributes: true,
		Version:          workflows.DeliveryVersion,
		Deployment:       "dep",
	}
	for i := range n {
		m := workflows.BatchMessage{MessageID: fmt.Sprintf("0195c2a0-0000-7000-8000-%012d", i)}
		if i == 1 {
			m.MaxRetryTimes = &retries // one attempt in all
		}
		b.input.Messages = append(b.input.Messages, m)
	}
	env.OnWorkflow(workflows.WorkflowType, mock.Anything, mock.Anything).Return(
		func(ctx workflow.Context, in workflows.DeliveryInput) (workflows.DeliveryResult, error) {
			b.mu.Lock()
			b.runs[in.MessageID] = in
			b.mu.Unlock()
			require.Equal(t, workflows.WorkflowID(in.MessageID), workflow.GetInfo(ctx).WorkflowExecution.ID)
			return workflows.DeliveryResult{Attempts: 2}, nil
		}).Maybe()
	t.Cleanup(func() { env.AssertExpectations(t) })
	return b
}

func (b *batchBundle) run(t *testing.T) workflows.BatchResult {
	t.Helper()
	b.env.ExecuteWorkflow(workflows.BatchWorkflowType, b.input)
	require.True(t, b.env.IsWorkflowCompleted())
	var panicErr *temporal.PanicError
	if errors.As(b.env.GetWorkflowError(), &panicErr) {
		t.Log(panicErr.StackTrace())
	}
	require.NoError(t, b.env.GetWorkflowError())
	var res workflows.BatchResult
	require.NoError(t, b.env.GetWorkflowResult(&res))
	return res
}

// answer returns a send-batch mock that reports outcome(i) for message i.
func (b *batchBundle) answer(t *testing.T, outcome func(i int, id string) workflows.BatchOutcome) func(context.Context, workflows.SendBatchInput) (workflows.SendBatchResult, error) {
	return func(_ context.Context, in workflows.SendBatchInput) (workflows.SendBatchResult, error) {
		require.Equal(t, "clicks", in.Topic)
		require.Equal(t, b.input.Messages, in.Messages)
		require.Equal(t, 8, in.Concurrency)
		require.Equal(t, 5, in.MaxAttempts)
		require.Equal(t, "dep", in.Deployment)
		require.Equal(t, workflows.BatchWorkflowID(b.input.Messages[0].MessageID), in.Batch)
		var res workflows.SendBatchResult
		for i, m := range in.Messages {
			o := outcome(i, m.MessageID)
			o.MessageID = m.MessageID
			res.Outcomes = append(res.Outcomes, o)
		}
		return res, nil
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()

	t.Run("AllDelivered", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 5)
		b.env.SetStartWorkflowOptions(startOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(b.answer(t, func(int, string) workflows.BatchOutcome {
			return workflows.BatchOutcome{Outcome: workflows.BatchSent, Recorded: true}
		})).Once()
		res := b.run(t)
		require.Equal(t, 5, res.Sent)
		require.Zero(t, res.HandedOver)
		require.Len(t, res.Outcomes, 5)
		require.Empty(t, b.runs, "no message needed a run of its own")
	})

	t.Run("TroubleLeavesTheBatch", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 6)
		b.env.SetStartWorkflowOptions(startOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(b.answer(t, func(i int, _ string) workflows.BatchOutcome {
			switch i {
			case 1:
				return workflows.BatchOutcome{Outcome: workflows.BatchFailed, Error: "HTTP 503", ErrType: workflows.ErrTypeRetryable, RetryAfter: 3 * time.Second}
			case 2:
				return workflows.BatchOutcome{Outcome: workflows.BatchFailed, Error: "HTTP 400", ErrType: workflows.ErrTypePermanent}
			case 3:
				return workflows.BatchOutcome{Outcome: workflows.BatchFailed, Error: "timed out", ErrType: workflows.ErrTypeAmbiguous}
			case 4:
				return workflows.BatchOutcome{Outcome: workflows.BatchSkipped, Note: "another batch holds the message"}
			}
			return workflows.BatchOutcome{Outcome: workflows.BatchSent, Recorded: true}
		})).Once()
		res := b.run(t)
		require.Equal(t, 2, res.Sent)
		require.Equal(t, 3, res.HandedOver)
		require.Len(t, b.runs, 3)
		batchID := workflows.BatchWorkflowID(b.input.Messages[0].MessageID)
		for i, want := range map[int]workflows.PriorAttempt{
			1: {Attempts: 1, Error: "HTTP 503", ErrType: workflows.ErrTypeRetryable, RetryAfter: 3 * time.Second, Batch: batchID},
			2: {Attempts: 1, Error: "HTTP 400", ErrType: workflows.ErrTypePermanent, Batch: batchID},
			3: {Attempts: 1, Error: "timed out", ErrType: workflows.ErrTypeAmbiguous, Batch: batchID},
		} {
			m := b.input.Messages[i]
			in, ok := b.runs[m.MessageID]
			require.True(t, ok, "message %d has a run of its own", i)
			require.Equal(t, &want, in.Prior)
			require.Nil(t, in.Policy.Batch, "a message's own run is of the message lane")
			require.Equal(t, "clicks", in.Topic)
			require.Equal(t, "dep", in.Deployment)
			require.Equal(t, workflows.DeliveryVersion, in.Version)
			require.False(t, in.LocalFirstAttempt(), "it goes on after the batch's attempt")
			require.Equal(t, workflows.BatchHandedOver, res.Outcomes[i].Outcome)
		}
		require.Equal(t, 1, b.runs[b.input.Messages[1].MessageID].Policy.MaxAttempts, "the row's max_retry_times still counts")
		require.Equal(t, 5, b.runs[b.input.Messages[2].MessageID].Policy.MaxAttempts)
		require.Equal(t, workflows.BatchSkipped, res.Outcomes[4].Outcome)
	})

	t.Run("SendLostWithItsWorker", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 3)
		b.env.SetStartWorkflowOptions(regularStartOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(workflows.SendBatchResult{},
			temporal.NewTimeoutError(0, errors.New("activity StartToClose timeout"))).Once()
		res := b.run(t)
		require.Equal(t, 3, res.HandedOver)
		for _, m := range b.input.Messages {
			in := b.runs[m.MessageID]
			require.NotNil(t, in.Prior)
			require.Equal(t, workflows.ErrTypeAmbiguous, in.Prior.ErrType, "any of them may have been sent")
		}
	})

	t.Run("FirstTaskTriedBeforeHandsOverWithNoAttemptUsed", func(t *testing.T) {
		// An earlier try of the first task failed (its worker lost mid-send, or the task
		// failed before the send): the send may have happened. Nothing is sent again here;
		// each message's own run checks first and then makes its first attempt, as after
		// a retried first task of its own, so a message allowed one attempt gets it.
		t.Parallel()
		b := setupBatch(t, 3)
		b.env.SetStartWorkflowOptions(startOptions(b.input))
		b.env.SetCurrentHistoryLength(6)
		res := b.run(t)
		require.Equal(t, 3, res.HandedOver)
		for _, m := range b.input.Messages {
			in := b.runs[m.MessageID]
			require.Nil(t, in.Prior, "no attempt of the batch's is counted")
			require.True(t, in.CheckFirst, "the run asks whether the downstream has it before it sends")
			require.False(t, in.LocalFirstAttempt())
		}
		require.Equal(t, 1, b.runs[b.input.Messages[1].MessageID].Policy.MaxAttempts, "its one attempt is still to come")
	})

	t.Run("DatabaseUnavailable", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 2)
		b.env.SetStartWorkflowOptions(regularStartOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(workflows.SendBatchResult{},
			temporal.NewApplicationError("connection refused", workflows.ErrTypeStoreUnavailable)).Once()
		res := b.run(t)
		require.Equal(t, 2, res.HandedOver)
		for _, m := range b.input.Messages {
			in := b.runs[m.MessageID]
			require.Nil(t, in.Prior, "nothing was sent: the run starts afresh")
			require.True(t, in.LocalFirstAttempt())
		}
	})

	t.Run("DeliveredNotRecorded", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 3)
		b.env.SetStartWorkflowOptions(startOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(b.answer(t, func(i int, _ string) workflows.BatchOutcome {
			return workflows.BatchOutcome{Outcome: workflows.BatchSent, Recorded: i == 0}
		})).Once()
		b.env.OnActivity(workflows.ActivityMarkSentAll, mock.Anything, workflows.MarkSentAllInput{
			MessageIDs: []string{b.input.Messages[1].MessageID, b.input.Messages[2].MessageID},
		}).Return(errors.New("database down")).Times(2)
		b.env.OnActivity(workflows.ActivityMarkSentAll, mock.Anything, mock.Anything).Return(nil).Once()
		res := b.run(t)
		require.Equal(t, 3, res.Sent)
		require.Zero(t, res.Unrecorded, "recorded on the third try")
		for _, o := range res.Outcomes {
			require.True(t, o.Recorded)
		}
	})

	t.Run("RegularActivity", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 2)
		b.input.Policy.FirstAttempt = workflows.FirstAttemptActivity
		require.False(t, b.input.LocalSend())
		b.env.SetStartWorkflowOptions(regularStartOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(b.answer(t, func(int, string) workflows.BatchOutcome {
			return workflows.BatchOutcome{Outcome: workflows.BatchSent, Recorded: true}
		})).Once()
		require.Equal(t, 2, b.run(t).Sent)
	})

	t.Run("NotAttemptedStartsAfresh", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 2)
		b.env.SetStartWorkflowOptions(startOptions(b.input))
		b.env.OnActivity(workflows.ActivitySendBatch, mock.Anything, mock.Anything).Return(b.answer(t, func(i int, _ string) workflows.BatchOutcome {
			if i == 1 {
				return workflows.BatchOutcome{Outcome: workflows.BatchFailed, ErrType: workflows.ErrTypeNotAttempted, Error: "not sent"}
			}
			return workflows.BatchOutcome{Outcome: workflows.BatchSent, Recorded: true}
		})).Once()
		res := b.run(t)
		require.Equal(t, 1, res.HandedOver)
		in := b.runs[b.input.Messages[1].MessageID]
		require.Nil(t, in.Prior, "nothing was sent: no attempt used")
	})

	t.Run("NewerVersionIsLeftForANewerWorker", func(t *testing.T) {
		t.Parallel()
		b := setupBatch(t, 1)
		b.input.Version = workflows.DeliveryVersion + 1
		b.env.ExecuteWorkflow(workflows.BatchWorkflowType, b.input)
		var panicErr *temporal.PanicError
		require.ErrorAs(t, b.env.GetWorkflowError(), &panicErr)
	})
}

// startOptions are the batch's start options as the relay sets them: its ID, and the
// workflow task timeout of a local send.
func startOptions(in workflows.BatchInput) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{ID: workflows.BatchWorkflowID(in.Messages[0].MessageID), TaskQueue: "outbox",
		WorkflowTaskTimeout: workflows.BatchTaskTimeout(in.Policy)}
}

// regularStartOptions start a batch as a client without the relay's task timeout does: its
// send is a regular activity.
func regularStartOptions(in workflows.BatchInput) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{ID: workflows.BatchWorkflowID(in.Messages[0].MessageID), TaskQueue: "outbox"}
}

// TestDeliveryGoesOnFromABatch pins a message's own run after its batch failed it: the
// backoff after the batch's attempt, then attempt 2; a check first after an ambiguous
// failure; the dead letter at once after a permanent one, or when the batch's attempt
// was the last.
func TestDeliveryGoesOnFromABatch(t *testing.T) {
	t.Parallel()
	policy := workflows.Policy{MaxAttempts: 3, InitialInterval: 2 * time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute}
	prior := func(errType string) *workflows.PriorAttempt {
		return &workflows.PriorAttempt{Attempts: 1, Error: "first try", ErrType: errType, Batch: "outbox-batch-x"}
	}
	begin := func(t *testing.T, p *workflows.PriorAttempt) *bundle {
		b := setup(t, policy)
		b.input.Version = workflows.DeliveryVersion
		b.input.Prior = p
		return b
	}

	t.Run("RetryableThenDelivered", func(t *testing.T) {
		t.Parallel()
		b := begin(t, prior(workflows.ErrTypeRetryable))
		start := b.env.Now()
		n := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.SendInput) (workflows.SendResult, error) {
			n++
			require.Equal(t, 2, in.Attempt, "the batch's was attempt 1")
			b.sends = append(b.sends, b.env.Now())
			return workflows.SendResult{Recorded: true}, nil
		}).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempts)
		require.GreaterOrEqual(t, b.sends[0].Sub(start), 2*time.Second, "the backoff after attempt 1 comes first")
	})

	t.Run("AmbiguousIsCheckedFirst", func(t *testing.T) {
		t.Parallel()
		b := begin(t, prior(workflows.ErrTypeAmbiguous))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(workflows.CheckProcessedResult{Supported: true, Processed: true}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.True(t, res.AlreadyProcessed, "the downstream had it from the batch: not sent again")
	})

	t.Run("PermanentIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := begin(t, prior(workflows.ErrTypePermanent))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == "permanent failure: first try"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("LastAttemptWasTheBatch", func(t *testing.T) {
		t.Parallel()
		one := policy
		one.MaxAttempts = 1
		b := setup(t, one)
		b.input.Version, b.input.Prior = workflows.DeliveryVersion, prior(workflows.ErrTypeRetryable)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == "gave up after 1 attempts: first try"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})
}

package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"math"
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

// Activity signatures the workflow calls by name; the test environment mocks them.
func send(context.Context, workflows.SendInput) (workflows.SendResult, error) {
	return workflows.SendResult{}, nil
}

// sendErrs adapts a mock send that answers with an error only: a delivered send that
// did not record the row, as a send activity of version 3 and earlier (the workflow runs
// mark-sent).
func sendErrs(f func(context.Context, workflows.SendInput) error) func(context.Context, workflows.SendInput) (workflows.SendResult, error) {
	return func(ctx context.Context, in workflows.SendInput) (workflows.SendResult, error) {
		return workflows.SendResult{}, f(ctx, in)
	}
}
func checkProcessed(context.Context, workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
	return workflows.CheckProcessedResult{}, nil
}
func markSent(context.Context, workflows.MarkSentInput) error     { return nil }
func deadLetter(context.Context, workflows.DeadLetterInput) error { return nil }

type bundle struct {
	env   *testsuite.TestWorkflowEnvironment
	input workflows.DeliveryInput
	sends []time.Time // test-clock time of each send attempt
}

func setup(t *testing.T, policy workflows.Policy) *bundle {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	env.RegisterActivityWithOptions(send, activity.RegisterOptions{Name: workflows.ActivitySend})
	env.RegisterActivityWithOptions(checkProcessed, activity.RegisterOptions{Name: workflows.ActivityCheckProcessed})
	env.RegisterActivityWithOptions(markSent, activity.RegisterOptions{Name: workflows.ActivityMarkSent})
	env.RegisterActivityWithOptions(deadLetter, activity.RegisterOptions{Name: workflows.ActivityDeadLetter})
	b := &bundle{env: env, input: workflows.DeliveryInput{
		MessageID: "0195c2a0-0000-7000-8000-000000000001",
		Topic:     "order.created",
		Policy:    policy,
	}}
	t.Cleanup(func() { env.AssertExpectations(t) })
	return b
}

// onSend answers the send attempts in order with errs (nil = delivered) and records the
// test-clock time of each attempt.
func (b *bundle) onSend(t *testing.T, errs ...error) {
	n := 0
	b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(sendErrs(func(_ context.Context, in workflows.SendInput) error {
		require.Equal(t, n+1, in.Attempt)
		require.Equal(t, b.input.MessageID, in.MessageID)
		b.sends = append(b.sends, b.env.Now())
		err := errs[n]
		n++
		return err
	})).Times(len(errs))
}

func (b *bundle) run() (workflows.DeliveryResult, error) {
	b.env.ExecuteWorkflow(workflows.WorkflowType, b.input)
	if !b.env.IsWorkflowCompleted() {
		return workflows.DeliveryResult{}, errors.New("workflow did not complete")
	}
	var res workflows.DeliveryResult
	if err := b.env.GetWorkflowError(); err != nil {
		return res, err
	}
	return res, b.env.GetWorkflowResult(&res)
}

func retryable(msg string) error {
	return temporal.NewApplicationError(msg, workflows.ErrTypeRetryable)
}

func requireDeadLettered(t *testing.T, err error) *temporal.ApplicationError {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, workflows.ErrTypeDeadLettered, appErr.Type())
	require.True(t, appErr.NonRetryable())
	return appErr
}

func TestDelivery(t *testing.T) {
	t.Parallel()
	policy := workflows.Policy{MaxAttempts: 4, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute}

	t.Run("Success", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
	})

	t.Run("TransientFailuresThenSuccessWithBackoff", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, retryable("HTTP 503"), retryable("HTTP 500"), nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
		require.Len(t, b.sends, 3)
		require.GreaterOrEqual(t, b.sends[1].Sub(b.sends[0]), time.Second)
		require.Less(t, b.sends[1].Sub(b.sends[0]), 2*time.Second)
		require.GreaterOrEqual(t, b.sends[2].Sub(b.sends[1]), 2*time.Second)
		require.Less(t, b.sends[2].Sub(b.sends[1]), 3*time.Second)
	})

	t.Run("BackoffTooLargeForADurationWaitsMaxInterval", func(t *testing.T) {
		// A new run waits the cap (and records the change's marker); runs recorded before
		// the change, which waited not at all there, replay as they ran
		// (testdata/before-backoff-cap).
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 1e12, MaxInterval: time.Hour})
		b.onSend(t, retryable("HTTP 503"), retryable("HTTP 503"), nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
		require.Equal(t, time.Second, b.sends[1].Sub(b.sends[0]).Truncate(time.Second))
		require.Equal(t, time.Hour, b.sends[2].Sub(b.sends[1]).Truncate(time.Second))
	})

	t.Run("RetryAfterHonouredAndCapped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, MaxInterval: 20 * time.Second})
		b.onSend(t,
			temporal.NewApplicationErrorWithOptions("HTTP 429", workflows.ErrTypeRetryable, temporal.ApplicationErrorOptions{NextRetryDelay: 10 * time.Second}),
			temporal.NewApplicationErrorWithOptions("HTTP 503", workflows.ErrTypeRetryable, temporal.ApplicationErrorOptions{NextRetryDelay: time.Hour}),
			nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
		gap1, gap2 := b.sends[1].Sub(b.sends[0]), b.sends[2].Sub(b.sends[1])
		require.True(t, gap1 >= 10*time.Second && gap1 < 11*time.Second, "Retry-After 10s, waited %s", gap1)
		require.True(t, gap2 >= 20*time.Second && gap2 < 21*time.Second, "Retry-After capped at max_interval 20s, waited %s", gap2)
	})

	t.Run("ExhaustionDeadLettersOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, retryable("HTTP 500"), retryable("HTTP 500"), retryable("HTTP 500"), retryable("HTTP 500: boom"))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.MessageID == b.input.MessageID && in.Attempts == 4 &&
				in.LastError == "gave up after 4 attempts: HTTP 500: boom" &&
				in.WorkflowID != "" && in.RunID != ""
		})).Return(nil).Once()
		_, err := b.run()
		appErr := requireDeadLettered(t, err)
		require.Contains(t, appErr.Error(), "HTTP 500: boom")
	})

	t.Run("PermanentFailureDeadLettersAfterOneAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, temporal.NewNonRetryableApplicationError("HTTP 400: bad order", workflows.ErrTypePermanent, nil))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == "permanent failure: HTTP 400: bad order"
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("MarkSentBoundedCompletesUnrecorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 2, MarkSentTimeout: 3 * time.Second})
		b.onSend(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(errors.New("database unreachable"))
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, Unrecorded: true}, res)
	})

	t.Run("DeadLetterActivityRetriedUntilItSucceeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.onSend(t, retryable("HTTP 500"))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(errors.New("database down")).Times(3)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("AmbiguousFailureThenAlreadyProcessedIsNotSentAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, temporal.NewApplicationError("read tcp: connection reset by peer", workflows.ErrTypeAmbiguous))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, workflows.CheckProcessedInput{MessageID: b.input.MessageID, Topic: b.input.Topic}).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: true}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 1}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, AlreadyProcessed: true}, res)
	})

	t.Run("TimeoutIsAmbiguousAndCheckedBeforeResend", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 3, SendTimeout: 5 * time.Second})
		calls := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(sendErrs(func(context.Context, workflows.SendInput) error {
			calls++
			if calls == 1 {
				return temporal.NewTimeoutError(0, nil) // as a start-to-close timeout reports
			}
			return nil
		})).Twice()
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: false}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 2}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempts)
	})

	t.Run("UnsupportedCheckIsAskedOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		ambiguous := temporal.NewApplicationError("timeout", workflows.ErrTypeAmbiguous)
		b.onSend(t, ambiguous, ambiguous, nil)
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: false}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
	})

	t.Run("NonAmbiguousFailureIsNotChecked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.onSend(t, retryable("HTTP 500"), nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		require.NoError(t, err)
	})
}

// TestMaxRetryTimes checks that max_retry_times NULL / 0 / 2 give 12 / 1 / 3 attempts, as
// the relay resolves them into the policy.
func TestMaxRetryTimes(t *testing.T) {
	t.Parallel()
	two, zero := 2, 0
	for _, tc := range []struct {
		name          string
		maxRetryTimes *int
		attempts      int
	}{
		{"Null", nil, workflows.DefaultMaxAttempts},
		{"Zero", &zero, 1},
		{"Two", &two, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			policy := workflows.ResolvePolicy(workflows.Policy{}, tc.maxRetryTimes)
			require.Equal(t, tc.attempts, policy.MaxAttempts)
			b := setup(t, policy)
			errs := make([]error, tc.attempts)
			for i := range errs {
				errs[i] = retryable("HTTP 500")
			}
			b.onSend(t, errs...)
			b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
				return in.Attempts == tc.attempts
			})).Return(nil).Once()
			_, err := b.run()
			requireDeadLettered(t, err)
			require.Len(t, b.sends, tc.attempts)
		})
	}
}

func TestPolicyBackoff(t *testing.T) {
	t.Parallel()
	p := workflows.Policy{InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: 5 * time.Second}
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second},
		[]time.Duration{p.Backoff(1), p.Backoff(2), p.Backoff(3), p.Backoff(4), p.Backoff(50)})

	// A coefficient whose product no Duration holds waits the cap, not a negative time
	// (for which workflow.Sleep returns at once: no wait at all).
	for _, tc := range []struct {
		p    workflows.Policy
		want []time.Duration
	}{
		{workflows.Policy{InitialInterval: time.Second, BackoffCoefficient: 1e10, MaxInterval: time.Hour},
			[]time.Duration{time.Second, time.Hour, time.Hour, time.Hour}},
		{workflows.Policy{InitialInterval: time.Second, BackoffCoefficient: 400, MaxInterval: 8760 * time.Hour},
			[]time.Duration{time.Second, 400 * time.Second, 160_000 * time.Second, 8760 * time.Hour}},
	} {
		require.NoError(t, tc.p.WithDefaults().Validate())
		require.Equal(t, tc.want, []time.Duration{tc.p.Backoff(1), tc.p.Backoff(2), tc.p.Backoff(3), tc.p.Backoff(4)},
			"coefficient %g", tc.p.BackoffCoefficient)
	}
	for _, c := range []float64{math.Inf(1), math.NaN()} {
		err := workflows.Policy{BackoffCoefficient: c}.WithDefaults().Validate()
		require.EqualError(t, err, fmt.Sprintf("backoff must be a finite number, got %g", c))
	}
}

func storeUnavailable() error {
	return temporal.NewApplicationError("load message: dial tcp 127.0.0.1:5432: connect: connection refused", workflows.ErrTypeStoreUnavailable)
}

func ambiguous(msg string) error {
	return temporal.NewApplicationError(msg, workflows.ErrTypeAmbiguous)
}

// TestDeliveryUnknownOutcomes covers the paths where the workflow cannot know whether a
// send reached the downstream, and the failures that are not the downstream's.
func TestDeliveryUnknownOutcomes(t *testing.T) {
	t.Parallel()
	policy := workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute}

	t.Run("StoreOutageUsesNoAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		// Attempt 1 fails at the downstream; attempt 2 finds the outbox database down for
		// ten tries (several minutes of test time); then attempts 2 and 3 reach the
		// downstream, and 3 succeeds. With 3 attempts, nothing is dead-lettered.
		var attempts []int
		calls := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(sendErrs(func(_ context.Context, in workflows.SendInput) error {
			calls++
			attempts = append(attempts, in.Attempt)
			switch {
			case calls == 1:
				return retryable("HTTP 503")
			case calls <= 11:
				return storeUnavailable()
			case calls == 12:
				return retryable("HTTP 503")
			}
			return nil
		})).Times(13)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3}).Return(nil).Once()
		start := b.env.Now()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
		require.Equal(t, []int{1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3}, attempts)
		require.Greater(t, b.env.Now().Sub(start), 3*time.Minute, "the outage lasted minutes of test time")
	})

	t.Run("BusyTopicUsesNoAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		// The worker had no send slot for the topic five times (its downstream hangs for
		// others' messages), then the send is made and delivers.
		var attempts []int
		calls := 0
		b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.SendInput) (workflows.SendResult, error) {
			calls++
			attempts = append(attempts, in.Attempt)
			b.sends = append(b.sends, b.env.Now())
			if calls <= 5 {
				return workflows.SendResult{}, temporal.NewApplicationError("topic has 100 sends running", workflows.ErrTypeTopicBusy)
			}
			return workflows.SendResult{Recorded: true}, nil
		}).Times(6)
		b.input.Version = workflows.DeliveryVersion
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 1, res.Attempts)
		require.Equal(t, []int{1, 1, 1, 1, 1, 1}, attempts)
		require.Equal(t, 135*time.Second, b.sends[5].Sub(b.sends[0]), "waits of 5s, 10s, 20s, 40s, 60s after the busy sends")
	})

	t.Run("CheckFirstSkipsTheSendWhenProcessed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.input.CheckFirst = true
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: true}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 0}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 0, AlreadyProcessed: true}, res)
		require.Empty(t, b.sends)
	})

	t.Run("CheckFirstThenSendWhenNotProcessed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		b.input.CheckFirst = true
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: false}, nil).Once()
		b.onSend(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 1, res.Attempts)
	})

	t.Run("LastAmbiguousAttemptIsCheckedBeforeDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 2})
		b.onSend(t, ambiguous("read: connection reset by peer"), ambiguous("send timed out"))
		answers := []bool{false, true} // before attempt 2: not processed; after it: processed
		n := 0
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(func(context.Context, workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
			n++
			return workflows.CheckProcessedResult{Supported: true, Processed: answers[n-1]}, nil
		}).Twice()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 2}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 2, AlreadyProcessed: true}, res)
	})

	t.Run("LastAmbiguousAttemptNotProcessedIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.onSend(t, ambiguous("send timed out"))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: false}, nil).Once()
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("UnansweredCheckStaysUnknownThroughACleanFailure", func(t *testing.T) {
		t.Parallel()
		// Attempt 1 times out; the check before attempt 2 cannot answer (its endpoint
		// answers 503 to every try); attempt 2 fails cleanly. Attempt 1 may still have
		// reached the downstream: the run asks again before the dead letter (two
		// attempts) or before attempt 3 (three), and the downstream has it.
		for _, attempts := range []int{2, 3} {
			b := setup(t, workflows.Policy{MaxAttempts: attempts})
			b.onSend(t, ambiguous("send timed out"), retryable("HTTP 503"))
			var checks []int // the attempts sent before each try of the check
			b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(func(context.Context, workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
				checks = append(checks, len(b.sends))
				if len(b.sends) < 2 {
					return workflows.CheckProcessedResult{}, errors.New("GET /events/1: HTTP 503")
				}
				return workflows.CheckProcessedResult{Supported: true, Processed: true}, nil
			})
			b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 2}).Return(nil).Once()
			res, err := b.run()
			require.NoError(t, err, "%d attempts", attempts)
			require.Equal(t, workflows.DeliveryResult{Attempts: 2, AlreadyProcessed: true}, res, "%d attempts: no further send", attempts)
			require.Equal(t, 1, checks[0], "%d attempts: checked before attempt 2", attempts)
			require.Equal(t, 2, checks[len(checks)-1], "%d attempts: checked after attempt 2", attempts)
		}
	})

	t.Run("AnsweredCheckLetsACleanFailureClearTheUnknown", func(t *testing.T) {
		t.Parallel()
		// The check answered "not there" before attempt 2: attempt 2's clean failure
		// leaves nothing unknown, and the last attempt goes without a check.
		b := setup(t, workflows.Policy{MaxAttempts: 3})
		b.onSend(t, ambiguous("send timed out"), retryable("HTTP 503"), nil)
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).
			Return(workflows.CheckProcessedResult{Supported: true, Processed: false}, nil).Once()
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
	})

	t.Run("UnansweredCheckBeforeTheChangeReplaysItsOldPath", func(t *testing.T) {
		t.Parallel()
		// A run recorded before unanswered-check-kept: the clean failure cleared the
		// unknown, and the message was dead-lettered without a check.
		b := setup(t, workflows.Policy{MaxAttempts: 3})
		b.env.OnGetVersion("unanswered-check-kept", workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
		b.onSend(t, ambiguous("send timed out"), retryable("HTTP 503"), retryable("HTTP 503"))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(func(context.Context, workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
			require.Len(t, b.sends, 1, "checked before attempt 2 only")
			return workflows.CheckProcessedResult{}, errors.New("GET /events/1: HTTP 503")
		})
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("DeadLetterThatFindsTheRowSentEndsDelivered", func(t *testing.T) {
		t.Parallel()
		// The last attempt timed out after its send recorded the row sent (a sink without
		// a check): the dead-letter step finds the row sent and writes no dead letter.
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.env.RegisterActivityWithOptions(func(context.Context, workflows.DeadLetterInput) (workflows.DeadLetterResult, error) {
			return workflows.DeadLetterResult{}, nil
		}, activity.RegisterOptions{Name: workflows.ActivityDeadLetter, DisableAlreadyRegisteredCheck: true})
		b.onSend(t, ambiguous("send timed out"))
		b.env.OnActivity(workflows.ActivityCheckProcessed, mock.Anything, mock.Anything).Return(workflows.CheckProcessedResult{}, nil)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(workflows.DeadLetterResult{AlreadySent: true}, nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1, AlreadyProcessed: true}, res)
	})

	t.Run("UnknownTopicIsRetriedThroughTheAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		unknown := temporal.NewNonRetryableApplicationError(`no handler for topic "order.created"`, workflows.ErrTypeUnknownTopic, nil)
		b.onSend(t, unknown, unknown, nil) // a worker that knows the topic takes attempt 3
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3}).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
	})

	t.Run("UnknownTopicEverywhereIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t, policy)
		unknown := temporal.NewNonRetryableApplicationError(`no handler for topic "order.created"`, workflows.ErrTypeUnknownTopic, nil)
		b.onSend(t, unknown, unknown, unknown)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 3 && in.LastError == `gave up after 3 attempts: no handler for topic "order.created"`
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})

	t.Run("RunsBeforeTheChangeKeepTheirPath", func(t *testing.T) {
		t.Parallel()
		// A run recorded before "unknown-outcome-checked" dead-letters an unknown topic at
		// once and does not check its last ambiguous attempt.
		b := setup(t, policy)
		b.env.OnGetVersion("unknown-outcome-checked", workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
		b.onSend(t, temporal.NewNonRetryableApplicationError(`no handler for topic "x"`, workflows.ErrTypeUnknownTopic, nil))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
			return in.Attempts == 1 && in.LastError == `permanent failure: no handler for topic "x"`
		})).Return(nil).Once()
		_, err := b.run()
		requireDeadLettered(t, err)
	})
}

// TestDatabaseStepsOutlastLongOutages checks that the steps that must succeed in the end
// keep retrying through a database outage far longer than one try's timeout.
func TestDatabaseStepsOutlastLongOutages(t *testing.T) {
	t.Parallel()

	t.Run("DeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.onSend(t, retryable("HTTP 500"))
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(errors.New("database down")).Times(12)
		b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.Anything).Return(nil).Once()
		start := b.env.Now()
		_, err := b.run()
		requireDeadLettered(t, err)
		require.Greater(t, b.env.Now().Sub(start), 5*time.Minute, "twelve failed tries span minutes")
	})

	t.Run("MarkSentOfRunsBeforeTheBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, workflows.Policy{MaxAttempts: 1})
		b.env.OnGetVersion("mark-sent-bounded", workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
		b.onSend(t, nil)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(errors.New("database down")).Times(12)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
		res, err := b.run()
		require.NoError(t, err)
		require.Equal(t, workflows.DeliveryResult{Attempts: 1}, res)
	})
}

// TestDefaultPolicyRidesOutTenMinuteOutage runs a delivery under the default policy while
// the downstream is down for ten minutes: the message is delivered, nothing dead-lettered.
func TestDefaultPolicyRidesOutTenMinuteOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, workflows.ResolvePolicy(workflows.Policy{}, nil))
	var start time.Time
	b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(sendErrs(func(_ context.Context, in workflows.SendInput) error {
		if start.IsZero() {
			start = b.env.Now()
		}
		b.sends = append(b.sends, b.env.Now())
		if b.env.Now().Sub(start) < 10*time.Minute {
			return retryable("dial tcp: connect: connection refused")
		}
		return nil
	}))
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
	res, err := b.run()
	require.NoError(t, err, "the default policy gave up during a 10-minute outage")
	require.Less(t, res.Attempts, workflows.DefaultMaxAttempts, "attempts to spare")
	t.Logf("delivered at attempt %d of %d, %s after the first", res.Attempts, workflows.DefaultMaxAttempts, b.sends[len(b.sends)-1].Sub(start))
}

// TestDeliveryVersionFromInput: a run whose input names DeliveryVersion takes the new
// paths without asking workflow.GetVersion (no marker, no search attribute update).
func TestDeliveryVersionFromInput(t *testing.T) {
	t.Parallel()
	b := setup(t, workflows.Policy{MaxAttempts: 2})
	b.input.Version = workflows.DeliveryVersion
	// Were GetVersion asked, it would answer "before every change".
	b.env.OnGetVersion(mock.Anything, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion).Maybe()
	unknown := temporal.NewNonRetryableApplicationError(`no handler for topic "x"`, workflows.ErrTypeUnknownTopic, nil)
	b.onSend(t, unknown, nil)
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(errors.New("database down"))
	res, err := b.run()
	require.NoError(t, err)
	require.Equal(t, workflows.DeliveryResult{Attempts: 2, Unrecorded: true}, res, "unknown topic retried; mark-sent bounded")
}

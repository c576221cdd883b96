package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/workflows"
)

func topicPaused() error {
	return temporal.NewApplicationError(`topic "order.created" is paused`, workflows.ErrTypeTopicPaused)
}

// recordedPaused is record-failure's answer when it recorded the attempt and found the
// topic paused.
func recordedPaused() error {
	return temporal.NewNonRetryableApplicationError(`recorded; topic "order.created" is paused`, workflows.ErrTypeTopicPaused, nil)
}

// TestPausedTopicUsesNoAttempt: a send that finds its topic paused uses up no attempt,
// however long the pause (two hours of test time here, under the default policy's three
// attempts); the run waits with growing timers capped at a minute, marks itself paused
// for the UI, and takes its status back when a send runs again.
func TestPausedTopicUsesNoAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		before   []error // sends before the pause
		after    []error // sends after it
		attempts []int   // the attempt of each send
		status   []string
	}{
		{"FromTheFirstSend", nil, []error{nil}, []int{1}, []string{"paused", "dispatched"}},
		{"AfterAFailedAttempt", []error{retryable("HTTP 503")}, []error{retryable("HTTP 503"), nil}, []int{2, 3}, []string{"retrying", "paused", "retrying"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, workflows.Policy{MaxAttempts: 3, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: time.Minute})
			b.input.Version, b.input.SearchAttributes = workflows.DeliveryVersion, true
			var (
				attempts    []int
				pausedSends []time.Time
				resumeAt    time.Time
			)
			calls := 0
			b.env.OnActivity(workflows.ActivitySend, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.SendInput) (workflows.SendResult, error) {
				calls++
				if calls <= len(tc.before) {
					return workflows.SendResult{}, tc.before[calls-1]
				}
				if resumeAt.IsZero() {
					resumeAt = b.env.Now().Add(2 * time.Hour)
				}
				if b.env.Now().Before(resumeAt) {
					pausedSends = append(pausedSends, b.env.Now())
					return workflows.SendResult{}, topicPaused()
				}
				attempts = append(attempts, in.Attempt)
				err := tc.after[len(attempts)-1]
				return workflows.SendResult{Recorded: err == nil}, err
			})
			upserts := b.recordUpserts()
			res, err := b.run()
			require.NoError(t, err)
			require.Equal(t, len(tc.before)+len(tc.after), res.Attempts)
			require.Equal(t, tc.attempts, attempts, "the attempt found paused is the one that runs after the resume")
			require.Equal(t, tc.status, *upserts)
			// 5 s, 10 s, 20 s, 40 s, then a minute at a time: about 2 actions a minute.
			var waits []time.Duration
			for i := 1; i < len(pausedSends); i++ {
				waits = append(waits, pausedSends[i].Sub(pausedSends[i-1]))
			}
			require.Equal(t, []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute}, waits[:5])
			require.Less(t, len(pausedSends), 125, "two hours paused cost ~2 sends a minute")
			require.Greater(t, len(pausedSends), 115)
		})
	}
}

// TestPausedTeamTopicWaitsBeforeItsNextAttempt: a team's activity does not read the
// pause, so a run of its topic learns of it when it records a failed attempt; it then waits
// (reading the row after each wait) until the resume, marked paused, and only then backs
// off and makes its next attempt: a two-hour pause uses up no attempt.
func TestPausedTeamTopicWaitsBeforeItsNextAttempt(t *testing.T) {
	t.Parallel()
	b := activitySetup(t, "")
	b.input.Version, b.input.SearchAttributes = workflows.DeliveryVersion, true
	b.onReserve(t, retryable("stock service in maintenance"), nil)
	var pausedAt time.Time
	b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.Anything).Return(func(context.Context, workflows.RecordFailureInput) error {
		pausedAt = b.env.Now()
		return recordedPaused()
	}).Once()
	reads := 0
	b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, mock.Anything).Return(func(context.Context, workflows.LoadMessageInput) (workflows.LoadMessageResult, error) {
		reads++
		return workflows.LoadMessageResult{Paused: b.env.Now().Sub(pausedAt) < 2*time.Hour}, nil
	})
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil).Once()
	upserts := b.recordUpserts()
	res, err := b.run()
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempts, "the pause used up no attempt")
	require.Len(t, b.sends, 2)
	require.GreaterOrEqual(t, b.sends[1].Sub(b.sends[0]), 2*time.Hour, "the next attempt waited for the resume")
	require.Less(t, b.sends[1].Sub(b.sends[0]), 2*time.Hour+2*time.Minute, "and came within a minute of it, after the backoff")
	require.Greater(t, reads, 115)
	require.Less(t, reads, 125, "about one read a minute")
	require.Equal(t, []string{"paused", "retrying"}, *upserts)
}

// recordUpserts records the values of the run's search-attribute upserts, in order.
func (b *bundle) recordUpserts() *[]string {
	var upserts []string
	b.env.OnUpsertTypedSearchAttributes(mock.Anything).Return(nil).Maybe().Run(func(args mock.Arguments) {
		for _, u := range args.Get(0).(temporal.SearchAttributes).GetUntypedValues() {
			upserts = append(upserts, u.(string))
		}
	})
	return &upserts
}

// TestPausedTeamTopicMakesItsLastAttemptAgain: a team's last attempt that fails while its
// topic is paused does not dead-letter the message; the run waits for the resume, backs
// off and makes the last attempt again, which delivers it.
func TestPausedTeamTopicMakesItsLastAttemptAgain(t *testing.T) {
	t.Parallel()
	b := activitySetup(t, "")
	b.input.Version, b.input.SearchAttributes = workflows.DeliveryVersion, true
	var attempts []int
	failures := []error{retryable("stock service down"), retryable("stock service down"), retryable("stock service in maintenance"), nil}
	b.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(func(_ context.Context, m delivery.Message) error {
		attempts = append(attempts, m.Attempt)
		b.sends = append(b.sends, b.env.Now())
		return failures[len(attempts)-1]
	}).Times(len(failures))
	var pausedAt time.Time
	b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.RecordFailureInput) error {
		if in.Attempt < 3 {
			return nil
		}
		pausedAt = b.env.Now()
		return recordedPaused()
	}).Times(3)
	b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, mock.Anything).Return(func(context.Context, workflows.LoadMessageInput) (workflows.LoadMessageResult, error) {
		return workflows.LoadMessageResult{Paused: b.env.Now().Sub(pausedAt) < time.Hour}, nil
	})
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: 3, TeamAttempt: true}).Return(nil).Once()
	upserts := b.recordUpserts()
	res, err := b.run()
	require.NoError(t, err)
	require.Equal(t, 3, res.Attempts)
	require.Equal(t, []int{1, 2, 3, 3}, attempts, "the last attempt, made during the pause, is made again")
	require.GreaterOrEqual(t, b.sends[3].Sub(b.sends[2]), time.Hour, "after the resume")
	require.Equal(t, []string{"retrying", "retrying", "paused", "retrying"}, *upserts)
}

// TestPausedTeamTopicLastAttemptUnderTheDefaultPolicy: the same under the policy a topic
// gets when its config sets none (12 attempts, waits of 1 s doubling to 5 min, about 18
// minutes from the first attempt to the twelfth). The team's service is down throughout;
// an operator pauses the topic while the twelfth attempt runs and resumes it an hour
// later. The message is not dead-lettered: the twelfth attempt is made again after the
// resume and delivers it.
func TestPausedTeamTopicLastAttemptUnderTheDefaultPolicy(t *testing.T) {
	t.Parallel()
	b := activitySetup(t, "")
	b.input.Policy = workflows.Policy{Activity: b.input.Policy.Activity}.WithDefaults()
	b.input.Version, b.input.SearchAttributes = workflows.DeliveryVersion, true
	last := workflows.DefaultMaxAttempts
	var attempts []int
	b.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(func(_ context.Context, m delivery.Message) error {
		require.Equal(t, last, m.MaxAttempts)
		attempts = append(attempts, m.Attempt)
		b.sends = append(b.sends, b.env.Now())
		if len(attempts) > last {
			return nil
		}
		return retryable("stock service down")
	}).Times(last + 1)
	var pausedAt time.Time
	b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.RecordFailureInput) error {
		if in.Attempt < last {
			return nil
		}
		pausedAt = b.env.Now()
		return recordedPaused()
	}).Times(last)
	b.env.OnActivity(workflows.ActivityLoadMessage, mock.Anything, mock.Anything).Return(func(context.Context, workflows.LoadMessageInput) (workflows.LoadMessageResult, error) {
		return workflows.LoadMessageResult{Paused: b.env.Now().Sub(pausedAt) < time.Hour}, nil
	})
	b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, workflows.MarkSentInput{MessageID: b.input.MessageID, Attempts: last, TeamAttempt: true}).Return(nil).Once()
	res, err := b.run()
	require.NoError(t, err, "not dead-lettered")
	require.Equal(t, last, res.Attempts)
	want := make([]int, 0, last+1)
	for a := 1; a <= last; a++ {
		want = append(want, a)
	}
	require.Equal(t, append(want, last), attempts, "the twelfth attempt, made during the pause, is made again")
	require.InDelta(t, 18*time.Minute, b.sends[last-1].Sub(b.sends[0]), float64(2*time.Minute), "the default backoff before the twelfth attempt")
	again := b.sends[last].Sub(b.sends[last-1])
	require.GreaterOrEqual(t, again, time.Hour, "made again after the resume")
	require.LessOrEqual(t, again, time.Hour+workflows.DefaultMaxInterval+2*time.Minute, "within the backoff of the resume")
}

// TestPausedTeamTopicLastAttemptBeforeTheChange: a run recorded before the last attempt
// was made again after a pause keeps dead-lettering the message, so its history replays.
func TestPausedTeamTopicLastAttemptBeforeTheChange(t *testing.T) {
	t.Parallel()
	b := activitySetup(t, "")
	b.input.Version = workflows.DeliveryVersion
	b.env.OnGetVersion("paused-last-attempt-again", workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
	b.onReserve(t, retryable("stock service down"), retryable("stock service down"), retryable("stock service in maintenance"))
	b.env.OnActivity(workflows.ActivityRecordFailure, mock.Anything, mock.Anything).Return(func(_ context.Context, in workflows.RecordFailureInput) error {
		if in.Attempt < 3 {
			return nil
		}
		return recordedPaused()
	}).Times(3)
	b.env.OnActivity(workflows.ActivityDeadLetter, mock.Anything, mock.MatchedBy(func(in workflows.DeadLetterInput) bool {
		return in.Attempts == 3
	})).Return(nil).Once()
	_, err := b.run()
	requireDeadLettered(t, err)
	require.Len(t, b.sends, 3)
}

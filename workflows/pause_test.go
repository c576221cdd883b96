package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/workflows"
)

func topicPaused() error {
	return temporal.NewApplicationError(`topic "order.created" is paused`, workflows.ErrTypeTopicPaused)
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
			var upserts []string
			b.env.OnUpsertTypedSearchAttributes(mock.Anything).Return(nil).Maybe().Run(func(args mock.Arguments) {
				for _, u := range args.Get(0).(temporal.SearchAttributes).GetUntypedValues() {
					upserts = append(upserts, u.(string))
				}
			})
			res, err := b.run()
			require.NoError(t, err)
			require.Equal(t, len(tc.before)+len(tc.after), res.Attempts)
			require.Equal(t, tc.attempts, attempts, "the attempt found paused is the one that runs after the resume")
			require.Equal(t, tc.status, upserts)
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

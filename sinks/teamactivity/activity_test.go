package teamactivity_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamactivity"
)

// TestActivity: a handler's failure kinds reach the delivery workflow as the
// ApplicationError types it reads, with the wait a Retryable or RetryAfter names; an
// error that already speaks Temporal passes as it is.
func TestActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := temporal.NewNonRetryableApplicationError("discontinued", "Discontinued", nil)
	for _, tc := range []struct {
		err          error
		typ          string
		nonRetryable bool
		wait         time.Duration
	}{
		{delivery.Permanent(errors.New("bad payload")), delivery.ErrTypePermanent, true, 0},
		{delivery.Retryable(errors.New("busy"), 3*time.Second), delivery.ErrTypeRetryable, false, 3 * time.Second},
		{delivery.Ambiguous(errors.New("reset")), delivery.ErrTypeAmbiguous, false, 0},
		{delivery.RetryAfter(errors.New("HTTP 500"), time.Minute), delivery.ErrTypeAmbiguous, false, time.Minute},
		{errors.New("unclassified"), delivery.ErrTypeAmbiguous, false, 0},
		{own, "Discontinued", true, 0},
		// A mark on an error from a Temporal call: the mark, the outermost, decides.
		{delivery.Permanent(fmt.Errorf("reserve: %w", temporal.NewApplicationError("no", "OrderRejected"))), delivery.ErrTypePermanent, true, 0},
		{delivery.Retryable(fmt.Errorf("reserve: %w", temporal.NewApplicationError("no", "OrderRejected")), time.Minute), delivery.ErrTypeRetryable, false, time.Minute},
		// An ApplicationError around a marked error keeps its own type.
		{temporal.NewNonRetryableApplicationError("rejected", "Rejected", delivery.Retryable(errors.New("busy"), time.Second)), "Rejected", true, 0},
	} {
		run := teamactivity.Activity(delivery.HandlerFunc(func(context.Context, delivery.Message) error { return tc.err }))
		err := run(ctx, delivery.Message{MessageID: "m"})
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr, "%v", tc.err)
		require.Equal(t, tc.typ, appErr.Type(), "%v", tc.err)
		require.Equal(t, tc.nonRetryable, appErr.NonRetryable(), "%v", tc.err)
		require.Equal(t, tc.wait, appErr.NextRetryDelay(), "%v", tc.err)
		var outer *temporal.ApplicationError
		if !errors.As(tc.err, &outer) || outer != tc.err {
			require.Equal(t, tc.err.Error(), appErr.Message())
		}
	}
	ok := teamactivity.Activity(delivery.HandlerFunc(func(context.Context, delivery.Message) error { return nil }))
	require.NoError(t, ok(ctx, delivery.Message{}))
}

type checker func() (bool, error)

func (c checker) CheckProcessed(context.Context, delivery.Message) (bool, error) { return c() }

// TestCheckActivity: a Checker that cannot tell answers "not processed", so the message is
// sent again; its other answers pass through.
func TestCheckActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	processed, err := teamactivity.CheckActivity(checker(func() (bool, error) { return false, delivery.ErrCheckUnsupported }))(ctx, delivery.Message{})
	require.NoError(t, err)
	require.False(t, processed)
	processed, err = teamactivity.CheckActivity(checker(func() (bool, error) { return true, nil }))(ctx, delivery.Message{})
	require.NoError(t, err)
	require.True(t, processed)
	_, err = teamactivity.CheckActivity(checker(func() (bool, error) { return false, errors.New("db down") }))(ctx, delivery.Message{})
	require.EqualError(t, err, "db down")
}

package delivery_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
)

func TestFailureKinds(t *testing.T) {
	t.Parallel()
	base := errors.New("downstream said no")
	permanent := fmt.Errorf("reserve stock: %w", delivery.Permanent(base))
	retryable := fmt.Errorf("reserve stock: %w", delivery.Retryable(base, 3*time.Second))
	ambiguous := delivery.Ambiguous(base)

	require.True(t, delivery.IsPermanent(permanent), "through a wrapping error")
	require.False(t, delivery.IsPermanent(retryable))
	require.False(t, delivery.IsPermanent(base))
	require.False(t, delivery.IsPermanent(nil))

	wait, ok := delivery.IsRetryable(retryable)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, wait)
	_, ok = delivery.IsRetryable(permanent)
	require.False(t, ok)
	_, ok = delivery.IsRetryable(nil)
	require.False(t, ok)

	require.True(t, delivery.IsAmbiguous(ambiguous))
	require.True(t, delivery.IsAmbiguous(base), "an unmarked error counts as ambiguous")
	require.False(t, delivery.IsAmbiguous(permanent))
	require.False(t, delivery.IsAmbiguous(nil))
	require.ErrorIs(t, permanent, base, "the marks keep the cause")
}

// A kind marked on a nil error (a handler that found nothing to wrap) is still a failure of
// that kind, and says so: it used to panic when its text was read.
func TestFailureKindsWithoutACause(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		text string
		kind delivery.Kind
	}{
		{delivery.Permanent(nil), "permanent failure", delivery.KindPermanent},
		{delivery.Retryable(nil, time.Second), "retryable failure", delivery.KindRetryable},
		{delivery.Ambiguous(nil), "ambiguous failure", delivery.KindAmbiguous},
		{delivery.RetryAfter(nil, time.Second), "ambiguous failure", delivery.KindAmbiguous},
	} {
		require.Error(t, c.err)
		require.Equal(t, c.text, c.err.Error())
		require.Equal(t, c.kind, delivery.KindOf(c.err))
		require.Equal(t, "wrapped: "+c.text, fmt.Errorf("wrapped: %w", c.err).Error())
	}
}

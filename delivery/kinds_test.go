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

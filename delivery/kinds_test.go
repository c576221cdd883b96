package activities_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/activities"
)

func TestFailureKinds(t *testing.T) {
	t.Parallel()
	base := errors.New("downstream said no")
	permanent := fmt.Errorf("reserve stock: %w", activities.Permanent(base))
	retryable := fmt.Errorf("reserve stock: %w", activities.Retryable(base, 3*time.Second))
	ambiguous := activities.Ambiguous(base)

	require.True(t, activities.IsPermanent(permanent), "through a wrapping error")
	require.False(t, activities.IsPermanent(retryable))
	require.False(t, activities.IsPermanent(base))
	require.False(t, activities.IsPermanent(nil))

	wait, ok := activities.IsRetryable(retryable)
	require.True(t, ok)
	require.Equal(t, 3*time.Second, wait)
	_, ok = activities.IsRetryable(permanent)
	require.False(t, ok)
	_, ok = activities.IsRetryable(nil)
	require.False(t, ok)

	require.True(t, activities.IsAmbiguous(ambiguous))
	require.True(t, activities.IsAmbiguous(base), "an unmarked error counts as ambiguous")
	require.False(t, activities.IsAmbiguous(permanent))
	require.False(t, activities.IsAmbiguous(nil))
	require.ErrorIs(t, permanent, base, "the marks keep the cause")
}

package dev

import (
	"context"
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
)

// A --fail-rate outside 0 to 1, NaN among them, is a usage error before anything starts.
func TestFailRateOutOfRange(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{2, -0.5, math.NaN()} {
		err := Run(context.Background(), nil, Options{FailRate: rate}, io.Discard)
		require.ErrorContains(t, err, "--fail-rate must be between 0 and 1")
		require.Equal(t, cli.ExitUsage, cli.ExitCode(err))
	}
}

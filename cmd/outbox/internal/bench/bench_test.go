package bench

import (
	"context"
	"io"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
)

func TestMedian(t *testing.T) {
	require.Equal(t, 0.0, median(nil))
	require.Equal(t, 20.0, median([]float64{30, 10, 20}))
	require.Equal(t, 30.0, median([]float64{40, 20}), "two runs: their mean, not the larger")
	require.Equal(t, 25.0, median([]float64{10, 40, 20, 30}))
}

// Options no bench can run are usage errors before anything starts: a bench that measured
// nothing printed empty tables and succeeded, and a rate no ticker takes panicked.
func TestRunRefusesWhatItCannotMeasure(t *testing.T) {
	good := Options{Messages: 10, LatencyMessages: 10, Runs: 1, Rate: 10}
	for _, c := range []struct {
		edit func(o *Options)
		want string
	}{
		{func(o *Options) { o.Rate = math.NaN() }, "--rate must be a positive number"},
		{func(o *Options) { o.Rate = math.Inf(1) }, "--rate must be a positive number"},
		{func(o *Options) { o.Rate = 3e9 }, "at most one a nanosecond, got 3e+09"},
		{func(o *Options) { o.Rate = 0 }, "--rate must be a positive number"},
		{func(o *Options) { o.Runs = 0 }, "--runs must be at least 1"},
		{func(o *Options) { o.Only = "naiv" }, `--only: "naiv" is not a part of this bench; use a comma-separated list of naive, bare, outbox, run, dev, latency`},
		{func(o *Options) { o.Only, o.Lane = "naive", laneBatch }, `"naive" is not a part of this bench; use a comma-separated list of message, batch, latency`},
		{func(o *Options) { o.Only, o.Isolation, o.Bulk = "latency", true, 10 }, "--isolation measures one thing and takes no --only"},
	} {
		o := good
		c.edit(&o)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := Run(ctx, nil, o, io.Discard)
		cancel()
		require.ErrorContains(t, err, c.want)
		require.Equal(t, cli.ExitUsage, cli.ExitCode(err), "%v", err)
	}
	require.NoError(t, checkOnly(Options{Only: "naive, run,latency"}))
	require.NoError(t, checkOnly(Options{Only: "batch,latency", Lane: laneBatch}))
}

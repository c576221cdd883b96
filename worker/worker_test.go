package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// A database that answers that the outbox's migrations are missing is an error at once:
// waiting for it, as for a database that does not answer, would never end.
func TestCheckTaskQueueRefusesADatabaseWithoutMigrations(t *testing.T) {
	t.Parallel()
	testdb.EachUnmigrated(t, func(t *testing.T, _ *pgxpool.Pool, st *store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := worker.CheckTaskQueue(ctx, nil, st, "outbox", nil)
		require.ErrorIs(t, err, store.ErrNotMigrated)
		require.Contains(t, err.Error(), "outbox migrate")
		require.NoError(t, ctx.Err(), "refused at once, not after waiting")
	})
}

// A retention schedule beyond the limits of the config file's retention keys is refused
// before Temporal is asked, as the config file refuses it: the purge activity would fail
// every run of it.
func TestEnsureRetentionScheduleRefusesWhatEveryRunWouldRefuse(t *testing.T) {
	t.Parallel()
	ok := workflows.RetentionInput{SentAfter: 7 * 24 * time.Hour, DiscardedAfter: 30 * 24 * time.Hour, BatchSize: 1000}
	for name, tc := range map[string]struct {
		in    func(workflows.RetentionInput) workflows.RetentionInput
		every time.Duration
		want  string
	}{
		"SentAfter":      {func(in workflows.RetentionInput) workflows.RetentionInput { in.SentAfter = 30 * time.Second; return in }, time.Hour, "sent_after must be at least 1m0s"},
		"DiscardedAfter": {func(in workflows.RetentionInput) workflows.RetentionInput { in.DiscardedAfter = time.Second; return in }, time.Hour, "discarded_after must be at least 1m0s"},
		"BatchSize":      {func(in workflows.RetentionInput) workflows.RetentionInput { in.BatchSize = 200000; return in }, time.Hour, "batch_size must be at most 100000"},
		"Interval":       {func(in workflows.RetentionInput) workflows.RetentionInput { return in }, 10 * time.Second, "interval must be at least 1m"},
	} {
		t.Run(name, func(t *testing.T) {
			// No client: the input is refused before one is used.
			err := worker.EnsureRetentionSchedule(context.Background(), nil, "outbox", tc.in(ok), tc.every)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

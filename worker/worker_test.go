package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/internal/deployment"
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

// A team's own worker that Register adds the outbox to polls with the identity Run's
// worker has: the relays read its workflow version from it, and other deployments its
// deployment.
func TestOptionsNameTheVersionAndDeployment(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	opts := worker.Options(sdkworker.Options{Identity: "billing-7f9c", MaxConcurrentActivityExecutionSize: 9}, worker.Deps{Deployment: id})
	require.Equal(t, 9, opts.MaxConcurrentActivityExecutionSize, "the team's options are kept")
	require.True(t, strings.HasPrefix(opts.Identity, "billing-7f9c"), opts.Identity)
	version, ok := deployment.VersionFromIdentity(opts.Identity)
	require.True(t, ok, opts.Identity)
	require.Equal(t, workflows.DeliveryVersion, version)
	of, ok := deployment.FromIdentity(opts.Identity)
	require.True(t, ok)
	require.Equal(t, id, of)

	bare := worker.Options(sdkworker.Options{}, worker.Deps{Deployment: id})
	_, ok = deployment.VersionFromIdentity(bare.Identity)
	require.True(t, ok, "an identity of the process's own when the team gives none: %s", bare.Identity)

	require.Equal(t, sdkworker.Options{Identity: "x"}, worker.Options(sdkworker.Options{Identity: "x"}, worker.Deps{}),
		"without a deployment (deps not from PrepareWorker) nothing is claimed")
}

// answering is a store whose database answers the deployment's read with an error, and
// says so (storedriver.Answerer), as the MySQL store does for a permission refused.
type answering struct {
	store.Delivery
	answered bool
}

var errRefused = errors.New("update command denied to user 'ro' (1142)")

func (answering) RecordTaskQueue(context.Context, string) (uuid.UUID, string, error) {
	return uuid.Nil, "", errRefused
}
func (a answering) Answered(err error) bool { return a.answered && errors.Is(err, errRefused) }

// A database's answer that is an error ends the worker's start at once, whatever the
// store; only no answer is waited for.
func TestCheckTaskQueueReturnsADatabasesAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := worker.CheckTaskQueue(ctx, nil, answering{answered: true}, "outbox", nil)
	require.ErrorIs(t, err, errRefused)
	require.NoError(t, ctx.Err(), "returned at once, not after waiting")

	// Without the answer told apart, the error is waited out until the context ends.
	short, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err = worker.CheckTaskQueue(short, nil, answering{}, "outbox", nil)
	require.Error(t, err)
	require.Error(t, short.Err(), "waited")
}

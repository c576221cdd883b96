package starter_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// describer is a recorder that also answers DescribeTaskQueue with one poller.
type describer struct {
	*recorder
	identity string
}

func (d describer) DescribeTaskQueue(context.Context, string, enumspb.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error) {
	return &workflowservice.DescribeTaskQueueResponse{Pollers: []*taskqueuepb.PollerInfo{{Identity: d.identity, LastAccessTime: timestamppb.Now()}}}, nil
}

// The relay records its task queue on the deployment, puts the deployment ID in every
// workflow's input, and refuses to start with a task queue other than the recorded one or
// while a worker of another deployment polls its task queue.
func TestRelayDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InputsCarryTheDeployment", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{TaskQueue: "orders"})
		id := enqueue(t, st, "order.created", nil)
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, store.StatusDispatched, status(t, st, id))
		own, tq, err := st.Deployment(ctx)
		require.NoError(t, err)
		require.Equal(t, "orders", tq, "the first relay records its task queue")
		require.Len(t, rec.inputs, 1)
		require.Equal(t, own.String(), rec.inputs[0].Deployment)
	})

	t.Run("RefusesAnotherTaskQueue", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		_, _, err := st.RecordTaskQueue(ctx, "outbox")
		require.NoError(t, err)
		id := enqueue(t, st, "order.created", nil)
		rec := newRecorder()
		r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "outbox-b"})
		require.NoError(t, err)
		for _, run := range []func() error{
			func() error { return r.Run(ctx) },
			func() error { _, err := r.RunOnce(ctx); return err },
		} {
			err := run()
			require.Error(t, err)
			for _, want := range []string{"task queue outbox-b is configured", "records task queue outbox", "a task queue belongs to one outbox database", "outbox migrate --move-task-queue"} {
				require.Contains(t, err.Error(), want)
			}
		}
		require.Empty(t, rec.starts)
		require.Equal(t, store.StatusPending, status(t, st, id), "nothing claimed")
	})

	// A database that answers that the migrations are missing stops the relay at once.
	t.Run("StopsOnADatabaseWithoutMigrations", func(t *testing.T) {
		t.Parallel()
		testdb.EachUnmigrated(t, func(t *testing.T, pool *pgxpool.Pool, st *store.Store) {
			rec := newRecorder()
			r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "outbox", PollInterval: 10 * time.Millisecond})
			require.NoError(t, err)
			runCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err = r.Run(runCtx)
			require.ErrorIs(t, err, store.ErrNotMigrated)
			require.Contains(t, err.Error(), "outbox migrate")
			require.NoError(t, runCtx.Err(), "stopped at once, not when its context ended")
			require.Empty(t, rec.starts)
		})
	})

	t.Run("RefusesAnotherDeploymentsWorkers", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		other := uuid.New()
		rec := newRecorder()
		r, err := starter.New(st, pool, describer{rec, "42@elsewhere@outbox:" + other.String()}, starter.Config{TaskQueue: "outbox"})
		require.NoError(t, err)
		err = r.Run(ctx)
		require.Error(t, err)
		require.Contains(t, err.Error(), "task queue outbox is polled by worker 42@elsewhere@outbox:"+other.String())
		require.Contains(t, err.Error(), "a task queue belongs to one outbox database")

		own, err := st.DeploymentID(ctx)
		require.NoError(t, err)
		r, err = starter.New(st, pool, describer{rec, "42@here@outbox:" + own.String()}, starter.Config{TaskQueue: "outbox"})
		require.NoError(t, err)
		_, err = r.RunOnce(ctx)
		require.NoError(t, err, "its own deployment's workers are fine")
	})
}

// A Nexus topic's row held back while a worker of an early version polls is no start:
// neither an accepted one, which would hide that Temporal refuses every other start of
// the pass, nor a refusal.
func TestHeldNexusRowsAreNoStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	own, _, err := st.RecordTaskQueue(ctx, "outbox")
	require.NoError(t, err)
	rec := newRecorder()
	rec.startErr = func(string) error { return serviceerror.NewPermissionDenied("request unauthorized", "") }
	nexus := workflows.Policy{Nexus: &workflows.NexusHandler{Endpoint: "orders", Service: "orders", Operation: "deliver", Timeout: time.Minute}}
	r, err := starter.New(st, pool, describer{rec, "2@old@outbox:" + own.String()}, starter.Config{TaskQueue: "outbox",
		Policy: func(topic string) workflows.Policy {
			if topic == "orders.nexus" {
				return nexus
			}
			return workflows.Policy{}
		}})
	require.NoError(t, err)
	held := enqueue(t, st, "orders.nexus", nil)
	enqueue(t, st, "order.created", nil)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.ErrorContains(t, r.StartsRefused(), "temporal refused all 1 workflow starts of the last pass: request unauthorized")
	require.Equal(t, store.StatusClaimed, status(t, st, held), "held, claimed again after its lease")
}

// A relay built in Go checks the policy of the topics without one of their own, as the
// config file's default entry is checked: a team's activity without its task queue is
// refused by New, not found out by every run.
func TestNewChecksTheDefaultPolicy(t *testing.T) {
	t.Parallel()
	pool, st := testdb.Schema(t)
	bad := workflows.Policy{Activity: &workflows.ActivityHandler{Activity: "ReserveStock"}}
	_, err := starter.New(st, pool, newRecorder(), starter.Config{Policy: func(string) workflows.Policy { return bad }})
	require.ErrorContains(t, err, "Policy")
	require.ErrorContains(t, err, "task_queue")
	_, err = starter.New(st, pool, newRecorder(), starter.Config{Policy: func(string) workflows.Policy { return workflows.Policy{MaxAttempts: 3} }})
	require.NoError(t, err)
}

// A worker of version 3, from before workers left a newer version's run alone, polls the
// task queue: the relay starts a sink topic's run at version 3, and leaves a Nexus
// topic's message claimed, unstarted, rather than start a run that worker would take the
// old way (as a sink's topic, which no newer worker could replay). Once only guarded
// workers poll, the Nexus run starts at its version.
func TestNexusRunsWaitForAnUnguardedWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	own, err := st.DeploymentID(ctx)
	require.NoError(t, err)
	nexus := workflows.Policy{Nexus: &workflows.NexusHandler{Endpoint: "orders", Service: "orders", Operation: "deliver", Timeout: 10 * time.Second}}
	cfg := starter.Config{TaskQueue: "outbox", Lease: time.Second, Policy: func(topic string) workflows.Policy {
		if topic == "orders.placed" {
			return nexus
		}
		return workflows.Policy{}
	}}
	rec := newRecorder()
	old, err := starter.New(st, pool, describer{rec, "42@web-1@outbox:" + own.String()}, cfg)
	require.NoError(t, err)
	sink := enqueue(t, st, "order.created", nil)
	held := enqueue(t, st, "orders.placed", nil)
	_, err = old.RunOnce(ctx)
	require.NoError(t, err)
	require.Len(t, rec.inputs, 1)
	require.Equal(t, "order.created", rec.inputs[0].Topic)
	require.Equal(t, 3, rec.inputs[0].Version)
	require.Equal(t, store.StatusDispatched, status(t, st, sink))
	require.Equal(t, store.StatusClaimed, status(t, st, held), "claimed, and claimed again after the lease")

	time.Sleep(1100 * time.Millisecond) // the lease
	upgraded, err := starter.New(st, pool, describer{rec, "42@web-1@delivery-v6@outbox:" + own.String()}, cfg)
	require.NoError(t, err)
	_, err = upgraded.RunOnce(ctx)
	require.NoError(t, err)
	require.Len(t, rec.inputs, 2)
	require.Equal(t, "orders.placed", rec.inputs[1].Topic)
	require.Equal(t, workflows.NexusVersion, rec.inputs[1].Version)
	require.Equal(t, store.StatusDispatched, status(t, st, held))
}

package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/internal/deployment"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// startDeploymentWorker runs a worker of e's outbox on taskQueue as a team's worker would
// (worker.Register, no start check): its identity and its OutboxDelivery name its
// deployment.
func (e *env) startDeploymentWorker(t *testing.T, taskQueue string) (uuid.UUID, func()) {
	t.Helper()
	id, err := e.store.DeploymentID(context.Background())
	require.NoError(t, err)
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	require.NoError(t, reg.Open(context.Background()))
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	w := sdkworker.New(e.client, taskQueue, sdkworker.Options{Identity: deployment.Identity("", id)})
	worker.Register(w, worker.Deps{Store: e.store, Handlers: reg, Logger: logger, Client: e.client, Deployment: id})
	require.NoError(t, w.Start())
	var once sync.Once
	stop := func() { once.Do(w.Stop) }
	t.Cleanup(stop)
	return id, stop
}

// TestTwoDeploymentsOneTaskQueue: two outbox databases whose workers poll one task queue.
// A worker of the other deployment that receives a message's workflow task or send
// refuses it: the message is never dead-lettered (in either database) and is delivered
// once, with one attempt, when its own deployment's worker runs. A worker or relay that
// starts while the other deployment's worker polls, or a relay configured with a task
// queue other than its database's, refuses to start.
func TestTwoDeploymentsOneTaskQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	a, b := newEnv(t, ts), newEnv(t, ts)
	queue := a.taskQueue
	b.taskQueue = queue
	a.createOrders(t)

	// A's relay starts first, on a task queue nobody polls yet (its first message handed
	// over shows it is past its start check); then only B's worker polls.
	a.startRelay(t)
	ids := []uuid.UUID{a.enqueueOrder(t, "order.created", 0, nil)}
	a.waitStatus(t, ids[0], store.StatusDispatched)
	bID, stopB := b.startDeploymentWorker(t, queue)
	aID, err := a.store.DeploymentID(ctx)
	require.NoError(t, err)
	require.NotEqual(t, aID, bID)

	for n := range 5 {
		ids = append(ids, a.enqueueOrder(t, "order.created", n+1, nil))
	}
	for _, id := range ids {
		a.waitStatus(t, id, store.StatusDispatched)
	}
	// B's worker is the only one: it takes every first workflow task, and refuses it.
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if !refusedByAnotherDeployment(t, a, id) {
				return false
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond, "B's worker refused the workflow tasks of A's messages")
	for _, id := range ids {
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, a.describe(t, id).WorkflowExecutionInfo.Status, "the run waits, open")
		require.Equal(t, store.StatusDispatched, a.status(t, id))
	}

	// While B's worker polls, neither a worker nor a relay of A starts on that task queue.
	reg, err := a.cfg.Registry(nil)
	require.NoError(t, err)
	err = worker.Run(ctx, worker.Config{Client: a.client, TaskQueue: queue, Deps: worker.Deps{Store: a.store, Handlers: reg, Logger: logger}})
	require.ErrorContains(t, err, "task queue "+queue+" is polled by worker")
	require.ErrorContains(t, err, "outbox deployment "+bID.String())
	require.ErrorContains(t, err, "a task queue belongs to one outbox database")
	r, err := starter.New(a.store, a.pool, a.client, starter.Config{TaskQueue: queue, Logger: logger})
	require.NoError(t, err)
	require.ErrorContains(t, r.Run(ctx), "outbox deployment "+bID.String())

	// B's worker stops (as the refusal says to) and A's own worker starts: every message
	// is delivered once, with one attempt, after the server's backoff of the workflow
	// task B refused (it grows with each refusal: 10s task timeout plus 5s, 10s, 20s ...).
	stopB()
	a.startDeploymentWorker(t, queue)
	for _, id := range ids {
		require.Eventually(t, func() bool { return a.status(t, id) == store.StatusSent }, 3*time.Minute, 100*time.Millisecond,
			"message %s never became sent", id)
		desc := describeClosed(t, a.client, workflows.WorkflowID(id.String()))
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.WorkflowExecutionInfo.Status)
		var res workflows.DeliveryResult
		require.NoError(t, a.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, &res))
		require.Equal(t, 1, res.Attempts)
		_, effects := a.recv.Count(id.String())
		require.Equal(t, 1, effects)
	}
	for _, e := range []*env{a, b} {
		dead, err := e.store.ListDeadLetters(ctx, store.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dead, "nothing dead-lettered in either database")
	}
	requests, _ := b.recv.Totals()
	require.Zero(t, requests, "B's downstream got none of A's messages")

	// A relay configured with a task queue other than its database's refuses to start.
	r, err = starter.New(a.store, a.pool, a.client, starter.Config{TaskQueue: "outbox-elsewhere", Logger: logger})
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorContains(t, err, "task queue outbox-elsewhere is configured")
	require.ErrorContains(t, err, "records task queue "+queue)
}

// refusedByAnotherDeployment reports whether the message's run has a workflow task that
// a worker of another deployment failed.
func refusedByAnotherDeployment(t *testing.T, e *env, id uuid.UUID) bool {
	t.Helper()
	iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		if f := ev.GetWorkflowTaskFailedEventAttributes(); f != nil && f.GetFailure() != nil {
			if strings.Contains(f.GetFailure().GetMessage(), workflows.ErrTypeWrongDeployment) {
				return true
			}
		}
	}
	return false
}

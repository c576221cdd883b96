package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestRedrive: a dead-lettered message is listed, redriven, and delivered by a second run
// under the same workflow ID; the first run failed, the second completed.
func TestRedrive(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)
	e.startWorker(t)
	e.startRelay(t)

	e.recv.SetStatus("order.failing", http.StatusBadRequest)
	id := e.enqueueOrderPlain(t, "order.failing", nil)
	e.waitStatus(t, id, store.StatusDead)

	open, err := e.store.ListDeadLetters(ctx, store.DeadLetterFilter{Topic: "order.failing"})
	require.NoError(t, err)
	require.Len(t, open, 1)
	require.Equal(t, id, open[0].MessageID)
	firstRun := open[0].RunID

	e.recv.ClearStatus("order.failing") // the downstream is fixed
	r, err := e.store.Redrive(ctx, id, "e2e")
	require.NoError(t, err)
	require.Equal(t, 1, r.RedriveCount)
	e.waitStatus(t, id, store.StatusSent)
	requests, effects := e.recv.Count(id.String())
	require.Equal(t, 2, requests, "one 400, then one delivery")
	require.Equal(t, 1, effects)

	desc := describeClosed(t, e.client, workflows.WorkflowID(id.String()))
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	require.NotEqual(t, firstRun, desc.GetWorkflowExecutionInfo().GetExecution().GetRunId())

	var runs map[string]enumspb.WorkflowExecutionStatus
	require.Eventually(t, func() bool {
		resp, err := e.client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: e.namespace,
			Query:     fmt.Sprintf("WorkflowId = '%s'", workflows.WorkflowID(id.String())),
		})
		require.NoError(t, err)
		runs = map[string]enumspb.WorkflowExecutionStatus{}
		for _, ex := range resp.GetExecutions() {
			runs[ex.GetExecution().GetRunId()] = ex.GetStatus()
		}
		return len(runs) == 2
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, runs[firstRun])
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, runs[desc.GetWorkflowExecutionInfo().GetExecution().GetRunId()])

	// Closed: the dead letter is no longer open, and a second redrive is refused.
	open, err = e.store.ListDeadLetters(ctx, store.DeadLetterFilter{Topic: "order.failing"})
	require.NoError(t, err)
	require.Empty(t, open)
	_, err = e.store.Redrive(ctx, id, "e2e")
	var notDead *store.NotDeadError
	require.ErrorAs(t, err, &notDead)
}

// holdDeadLetter is a worker interceptor that holds the first dead-letter step of a run
// after the dead letter has committed, until release is closed, and then loses that
// step's completion (it fails, so the local activity runs again): the window between the
// dead-letter commit and the run's close, widened, followed by a second dead-letter step
// of the same run.
type holdDeadLetter struct {
	interceptor.WorkerInterceptorBase
	deadLettered chan string // the run ID, once its dead letter has committed
	release      chan struct{}
	calls        atomic.Int32
}

func (h *holdDeadLetter) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &holdDeadLetterActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, h: h}
}

type holdDeadLetterActivity struct {
	interceptor.ActivityInboundInterceptorBase
	h *holdDeadLetter
}

func (a *holdDeadLetterActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	res, err := a.Next.ExecuteActivity(ctx, in)
	info := activity.GetInfo(ctx)
	if err != nil || info.ActivityType.Name != workflows.ActivityDeadLetter {
		return res, err
	}
	a.h.calls.Add(1)
	if info.Attempt > 1 {
		return res, err
	}
	a.h.deadLettered <- info.WorkflowExecution.RunID
	select {
	case <-a.h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, errors.New("the dead-letter step's completion was lost")
}

// TestRedriveBeforeTheDeadLetteringRunCloses: an operator redrives a message after its
// run committed the dead letter but before that run closed, and the run's dead-letter
// step then runs again. The redrive stands (the row is not dead again), the closing run is
// not taken for the row's owner (the row is not left dispatched with no run), and as soon
// as that run has failed the relay starts a new run that delivers the message.
func TestRedriveBeforeTheDeadLetteringRunCloses(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)
	hold := &holdDeadLetter{deadLettered: make(chan string, 1), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold.release) }) }
	t.Cleanup(release)
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue,
			Options: sdkworker.Options{Interceptors: []interceptor.WorkerInterceptor{hold}},
			Deps:    worker.Deps{Store: e.store, Handlers: reg, Logger: logger}})
	})
	e.startRelay(t) // no reconciler: a row left dispatched with no run would stay so

	e.recv.SetStatus("order.failing", http.StatusBadRequest)
	id := e.enqueueOrderPlain(t, "order.failing", nil)
	wid := workflows.WorkflowID(id.String())
	var firstRun string
	select {
	case firstRun = <-hold.deadLettered:
	case <-time.After(60 * time.Second):
		t.Fatal("the message was not dead-lettered")
	}
	require.Equal(t, store.StatusDead, e.status(t, id))
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, e.describe(t, id).GetWorkflowExecutionInfo().GetStatus(),
		"the dead-lettering run has not closed")

	e.recv.ClearStatus("order.failing") // the downstream is fixed
	_, err = e.store.Redrive(ctx, id, "e2e")
	require.NoError(t, err)
	// The relay claims the row and meets the run that is still closing, more than once.
	require.Eventually(t, func() bool { return e.status(t, id) == store.StatusClaimed }, 10*time.Second, 20*time.Millisecond)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		st := e.status(t, id)
		require.Contains(t, []store.Status{store.StatusPending, store.StatusClaimed}, st,
			"the run that dead-lettered the message does not own it after the redrive")
		time.Sleep(50 * time.Millisecond)
	}

	// The run's dead-letter step runs again and the run fails; a new run delivers.
	released := time.Now()
	release()
	e.waitStatus(t, id, store.StatusSent)
	require.Less(t, time.Since(released), 15*time.Second, "delivered within seconds, not at reconciliation")
	require.GreaterOrEqual(t, hold.calls.Load(), int32(2), "the dead-letter step ran again after the redrive")

	desc := describeClosed(t, e.client, wid)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	require.NotEqual(t, firstRun, desc.GetWorkflowExecutionInfo().GetExecution().GetRunId())
	old, err := e.client.DescribeWorkflowExecution(ctx, wid, firstRun)
	require.NoError(t, err)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, old.GetWorkflowExecutionInfo().GetStatus())

	_, effects := e.recv.Count(id.String())
	require.Equal(t, 1, effects)
	dls, err := e.store.DeadLetters(ctx, id)
	require.NoError(t, err)
	require.Len(t, dls, 1, "the second dead-letter step wrote nothing")
	require.Equal(t, firstRun, dls[0].RunID)
	require.NotNil(t, dls[0].RedrivenAt, "the dead letter stays redriven")
	var dispatched int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages WHERE status = 'dispatched'`).Scan(&dispatched))
	require.Zero(t, dispatched)
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/outbox-go/outbox/store"
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

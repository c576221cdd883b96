package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestSearchAttributesOff: `outbox run` with `search_attributes: false`, on a namespace
// where the outbox's search attributes were never created (a Temporal Cloud namespace
// whose API key may not create them, say). A message sent first time, one sent after a
// retry and one dead-lettered each end as they do with the attributes on: no start, no
// workflow task and no step sets an attribute the namespace does not have; so does a
// message of the batch lane.
func TestSearchAttributesOff(t *testing.T) {
	t.Parallel()
	ts := temporaltest.NewServer(temporaltest.WithT(t)) // without the outbox's search attributes
	pool, st := testdb.Schema(t)
	recv := newReceiver(t)
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %s
search_attributes: false
temporal:
  address: %s
  namespace: %s
  task_queue: sa-off-%s
relay:
  poll_interval: 200ms
topics:
  order.created:
    url: %s/events
  order.refused:
    url: %s/events
  page.viewed:
    url: %s/events
    lane: batch
`, st.Schema(), ts.GetFrontendHostPort(), ts.GetDefaultNamespace(), st.Schema(), recv.URL, recv.URL, recv.URL)), 0o600))
	p := startOutbox(t, "", map[string]string{"DATABASE_URL": testdb.URL()}, "run", "--config", cfgPath)
	t.Cleanup(func() {
		code, exited := p.interrupt(30 * time.Second)
		require.True(t, exited, "outbox run did not stop within 30s:\n%s", p.out)
		require.Equal(t, 0, code, p.out.String())
	})

	ctx := context.Background()
	enqueue := func(topic string) string {
		id, err := st.Enqueue(ctx, pool, store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 7}`)})
		require.NoError(t, err)
		return id.String()
	}
	recv.SetStatus("order.refused", http.StatusBadRequest)
	first, retried, dead, batched := enqueue("order.created"), enqueue("order.created"), enqueue("order.refused"), enqueue("page.viewed")
	recv.Reject(retried, http.StatusServiceUnavailable)
	require.Eventually(t, func() bool { requests, _ := recv.Count(retried); return requests >= 1 }, 60*time.Second, 20*time.Millisecond,
		"the retried message never reached the downstream:\n%s", p.out)
	recv.Reject(retried, 0)
	waitRow := func(id string, status store.Status) {
		t.Helper()
		require.Eventually(t, func() bool {
			row, err := st.Get(ctx, uuid.MustParse(id))
			return err == nil && row.Status == status
		}, 90*time.Second, 50*time.Millisecond, "message %s never became %s:\n%s", id, status, p.out)
	}

	c := ts.GetDefaultClient()
	for id, want := range map[string]struct {
		status   store.Status
		run      enumspb.WorkflowExecutionStatus
		requests int
	}{
		first:   {store.StatusSent, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, 1},
		retried: {store.StatusSent, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, 2},
		dead:    {store.StatusDead, enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, 1},
	} {
		waitRow(id, want.status)
		desc := describeClosed(t, c, workflows.WorkflowID(id))
		require.Equal(t, want.run, desc.GetWorkflowExecutionInfo().GetStatus(), id)
		for name := range desc.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields() {
			require.False(t, strings.HasPrefix(name, "Outbox"), "message %s has search attribute %s", id, name)
		}
		requests, _ := recv.Count(id)
		require.Equal(t, want.requests, requests, id)
		requireNoFailedWorkflowTask(t, c, workflows.WorkflowID(id))
	}
	// The batch lane's message: its row, and the batch run that sent it.
	waitRow(batched, store.StatusSent)
	requests, _ := recv.Count(batched)
	require.Equal(t, 1, requests)
	batches, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Namespace: ts.GetDefaultNamespace(), Query: fmt.Sprintf("WorkflowType = '%s'", workflows.BatchWorkflowType),
	})
	require.NoError(t, err)
	require.Len(t, batches.GetExecutions(), 1)
	batch := describeClosed(t, c, batches.GetExecutions()[0].GetExecution().GetWorkflowId())
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, batch.GetWorkflowExecutionInfo().GetStatus())
	requireNoFailedWorkflowTask(t, c, batch.GetWorkflowExecutionInfo().GetExecution().GetWorkflowId())

	require.NotContains(t, strings.ToLower(p.out.String()), "search attribute", "outbox run:\n%s", p.out)
}

// requireNoFailedWorkflowTask requires that no workflow task of the workflow's current
// run failed (a command the server refused fails its task, which is then retried, and
// the history shows it).
func requireNoFailedWorkflowTask(t *testing.T, c client.Client, workflowID string) {
	t.Helper()
	it := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		if a := ev.GetWorkflowTaskFailedEventAttributes(); a != nil {
			t.Fatalf("a workflow task of %s failed: %s: %s", workflowID, a.GetCause(), a.GetFailure().GetMessage())
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
)

// TestUIQueriesFindEveryStatus: the workflow searches the README gives find a sent, a
// retrying and a dead message, each by its own query and by no other.
func TestUIQueriesFindEveryStatus(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	slow := e.cfg.Topics["order.created"]
	slow.InitialInterval, slow.MaxInterval = config.Duration(time.Minute), config.Duration(time.Minute) // stays retrying
	e.cfg.Topics["order.slow"] = slow
	e.recv.SetStatus("order.slow", http.StatusServiceUnavailable)
	e.recv.SetStatus("order.failing", http.StatusBadRequest)
	e.startWorker(t)
	e.startRelay(t)

	sent := e.enqueueOrderPlain(t, "order.created", nil)
	retrying := e.enqueueOrderPlain(t, "order.slow", nil)
	dead := e.enqueueOrderPlain(t, "order.failing", nil)
	e.waitStatus(t, sent, store.StatusSent)
	e.waitStatus(t, dead, store.StatusDead)

	queries := map[string]string{
		"sent":     "ExecutionStatus = 'Completed'",
		"retrying": "OutboxStatus = 'retrying' AND ExecutionStatus = 'Running'",
		"dead":     "OutboxStatus = 'dead'",
	}
	want := map[string]uuid.UUID{"sent": sent, "retrying": retrying, "dead": dead}
	for status, query := range queries {
		require.Eventually(t, func() bool {
			var found []string
			for _, id := range []uuid.UUID{sent, retrying, dead} {
				resp, err := e.client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
					Namespace: e.namespace,
					Query:     fmt.Sprintf("OutboxMessageId = '%s' AND %s", id, query),
				})
				require.NoError(t, err)
				if len(resp.GetExecutions()) > 0 {
					found = append(found, id.String())
				}
			}
			return len(found) == 1 && found[0] == want[status].String()
		}, 30*time.Second, 200*time.Millisecond, "%s: %q finds exactly that message", status, query)
	}
}

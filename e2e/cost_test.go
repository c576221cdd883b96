package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"

	"github.com/outbox-go/outbox/internal/temporalcost"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestCostOfADeliveredMessage: what an http topic's delivered message costs on Temporal,
// counted from its real history by Temporal Cloud's rules (docs/benchmarks.md): the
// figure teams on Cloud pay by, and that caps messages per second at a namespace's
// actions-per-second limit.
func TestCostOfADeliveredMessage(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.startWorker(t)
	e.startRelay(t)
	id := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatus(t, id, store.StatusSent)
	ctx := context.Background()
	var res workflows.DeliveryResult
	require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, &res))

	iter := e.client.GetWorkflowHistory(ctx, workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []*historypb.HistoryEvent
	var types []string
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		events = append(events, ev)
		types = append(types, strings.TrimPrefix(ev.GetEventType().String(), "EVENT_TYPE_"))
	}
	cost := temporalcost.Count(events)
	t.Logf("%d actions, %d events: %s", cost.Actions, cost.Events, strings.Join(types, " "))
	// The start, the send (a regular activity) and mark-sent (a local activity of the next
	// workflow task); the run's Completed status says sent, without an upsert.
	require.Equal(t, temporalcost.Cost{Actions: 3, Events: 12}, cost)
}

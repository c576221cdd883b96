package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/temporalcost"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestCostOfADeliveredMessage: what a delivered message's run costs on Temporal, counted
// from its real history by Temporal Cloud's rules (docs/benchmarks.md): the figure teams
// on Cloud pay by, and that caps messages per second at a namespace's actions-per-second
// limit. The team's own activity or workflow is the team's, not counted here.
func TestCostOfADeliveredMessage(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	teamQueue := "team-" + e.store.Schema()
	e.cfg.Topics["inventory.reserve"] = config.Topic{Activity: "ReserveStock", TaskQueue: teamQueue}
	e.cfg.Topics["order.fulfil"] = config.Topic{Workflow: "FulfilOrder", TaskQueue: teamQueue}
	retried := e.cfg.Topics["order.created"]
	e.cfg.Topics["order.retried"] = retried
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(func(context.Context, delivery.Message) error { return nil }, activity.RegisterOptions{Name: "ReserveStock"})
		w.RegisterWorkflowWithOptions(func(workflow.Context, delivery.Message) error { return nil }, workflow.RegisterOptions{Name: "FulfilOrder"})
	})
	e.startWorker(t)
	e.startRelay(t)
	ctx := context.Background()

	// The receiver turns the first request of order.retried away (503), then accepts.
	var failedOnce bool
	e.recv.SetStatus("order.retried", http.StatusServiceUnavailable)
	enqueue := func(topic string) uuid.UUID {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 7}`)})
		require.NoError(t, err)
		return id
	}
	for _, tc := range []struct {
		topic string
		want  temporalcost.Cost
		why   string
		// extraEvents are events a race may add: a child that completes while the
		// workflow task that started it runs fails that task (UnhandledCommand), and the
		// retried task adds 4 events, no action.
		extraEvents int
	}{
		{"order.created", temporalcost.Cost{Actions: 2, Events: 6}, "the start, and the first workflow task's local activities (the send, which records the row sent)", 0},
		{"inventory.reserve", temporalcost.Cost{Actions: 3, Events: 12}, "the start (the message in its input), the team's activity, mark-sent (local, the next task)", 0},
		{"order.fulfil", temporalcost.Cost{Actions: 3, Events: 11}, "the start (the message in its input), the child start, mark-sent (local, the next task)", 4},
		{"order.retried", temporalcost.Cost{Actions: 5, Events: 18}, "the start, the local first attempt, the retrying upsert, the backoff timer, the second send (which records the row)", 0},
	} {
		id := enqueue(tc.topic)
		if tc.topic == "order.retried" && !failedOnce {
			require.Eventually(t, func() bool { n, _ := e.recv.Count(id.String()); return n >= 1 }, 30*time.Second, 20*time.Millisecond)
			e.recv.ClearStatus("order.retried")
			failedOnce = true
		}
		e.waitStatus(t, id, store.StatusSent)
		var res workflows.DeliveryResult
		require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, &res))
		cost, types := historyCost(t, e, workflows.WorkflowID(id.String()))
		t.Logf("%s: %d actions, %d events: %s", tc.topic, cost.Actions, cost.Events, types)
		require.Equal(t, tc.want.Actions, cost.Actions, "%s: %s", tc.topic, tc.why)
		require.GreaterOrEqual(t, cost.Events, tc.want.Events, tc.topic)
		require.LessOrEqual(t, cost.Events, tc.want.Events+tc.extraEvents, tc.topic)
		if tc.topic == "order.retried" {
			requireAttemptsInHistory(t, e, id, []string{"HTTP 503"})
		}
	}
}

// sendAttempt is one send attempt as a message's history shows it.
type sendAttempt struct {
	local   bool   // a local activity (a marker) rather than an activity task
	attempt int    // SendInput.Attempt
	failure string // the failure's message; "" when it was delivered
}

// sendAttempts reads the send attempts of a message's latest run from its history: the
// local first attempt's marker, and each regular send's scheduled event with its outcome.
func sendAttempts(t *testing.T, e *env, id uuid.UUID) []sendAttempt {
	t.Helper()
	dc := converter.GetDefaultDataConverter()
	var out []sendAttempt
	scheduled := map[int64]int{} // scheduled event ID -> index in out
	iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			m := ev.GetMarkerRecordedEventAttributes()
			var data struct {
				ActivityType string `json:"ActivityType"`
			}
			require.NoError(t, dc.FromPayloads(m.GetDetails()["data"], &data))
			if data.ActivityType != workflows.ActivitySend {
				continue
			}
			// The marker does not keep the local activity's input: the local send is the
			// run's first attempt.
			out = append(out, sendAttempt{local: true, attempt: 1, failure: m.GetFailure().GetMessage()})
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			a := ev.GetActivityTaskScheduledEventAttributes()
			if a.GetActivityType().GetName() != workflows.ActivitySend {
				continue
			}
			var in workflows.SendInput
			require.NoError(t, dc.FromPayloads(a.GetInput(), &in))
			scheduled[ev.GetEventId()] = len(out)
			out = append(out, sendAttempt{attempt: in.Attempt})
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED:
			a := ev.GetActivityTaskFailedEventAttributes()
			if i, ok := scheduled[a.GetScheduledEventId()]; ok {
				out[i].failure = a.GetFailure().GetMessage()
			}
		}
	}
	return out
}

// requireAttemptsInHistory checks that a message delivered after len(failures) failed
// attempts shows each attempt in its history: the first a local activity, the others
// regular ones, each failed one with its error (failures[i] is part of attempt i+1's).
func requireAttemptsInHistory(t *testing.T, e *env, id uuid.UUID, failures []string) {
	t.Helper()
	got := sendAttempts(t, e, id)
	require.Len(t, got, len(failures)+1, "%+v", got)
	for i, a := range got {
		require.Equal(t, i == 0, a.local, "attempt %d: local", i+1)
		require.Equal(t, i+1, a.attempt, "%+v", got)
		if i < len(failures) {
			require.Contains(t, a.failure, failures[i], "attempt %d's error", i+1)
		} else {
			require.Empty(t, a.failure, "the last attempt delivered")
		}
	}
}

// historyCost counts the latest run of workflowID and lists its event types.
func historyCost(t *testing.T, e *env, workflowID string) (temporalcost.Cost, string) {
	t.Helper()
	iter := e.client.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []*historypb.HistoryEvent
	var types []string
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		events = append(events, ev)
		types = append(types, strings.TrimPrefix(ev.GetEventType().String(), "EVENT_TYPE_"))
	}
	return temporalcost.Count(events), strings.Join(types, " ")
}

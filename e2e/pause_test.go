package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
)

// TestPauseTopic: the downstream of order.created announces maintenance while one of its
// messages is between attempts (the downstream failed its first try). With the default
// policy, the topic is paused: new messages of it are not handed to Temporal, the one
// under way waits without using attempts and shows as paused in the UI's search and in
// the row, another topic is delivered as usual, and a relay started during the pause
// holds the topic too (the pause lives in the database). After the resume every message
// is delivered once, and the one that waited has used one attempt per real try.
func TestPauseTopic(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	e.cfg.Topics = map[string]config.Topic{
		"order.created": {Sink: "http", URL: e.recv.URL + "/events"}, // the default policy
		"order.other":   {Sink: "http", URL: e.recv.URL + "/events"},
	}
	e.recv.SetStatus("order.created", http.StatusServiceUnavailable)
	e.startWorker(t)
	e.startRelay(t)

	inFlight := e.enqueueOrderPlain(t, "order.created", nil)
	require.Eventually(t, func() bool { n, _ := e.recv.Count(inFlight.String()); return n >= 1 }, 30*time.Second, 20*time.Millisecond)
	_, made, err := e.store.PauseTopic(ctx, "order.created", "ops", "billing API maintenance")
	require.NoError(t, err)
	require.True(t, made)

	// The run under way finds the topic paused at its next attempt and says so.
	e.requireFound(t, inFlight, "OutboxStatus = 'paused' AND ExecutionStatus = 'Running'")
	triesBefore, _ := e.recv.Count(inFlight.String())
	e.recv.ClearStatus("order.created") // the downstream is back, but the topic stays paused

	var held []uuid.UUID
	for range 3 {
		held = append(held, e.enqueueOrderPlain(t, "order.created", nil))
	}
	other := e.enqueueOrderPlain(t, "order.other", nil)
	e.waitStatus(t, other, store.StatusSent)
	// A relay that starts during the pause holds the topic too.
	e.startRelayWith(t, e.store, starter.Config{})

	time.Sleep(30 * time.Second) // the pause: a fault of a given length, not a wait for an event
	for _, id := range held {
		row, err := e.store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusPending, row.Status, "message %s was handed over during the pause", id)
		require.True(t, row.Paused)
		_, err = e.client.DescribeWorkflowExecution(ctx, "outbox-"+id.String(), "")
		require.Error(t, err, "no run for a held message")
	}
	tries, _ := e.recv.Count(inFlight.String())
	require.Equal(t, triesBefore, tries, "no send reached the downstream during the pause")
	row, err := e.store.Get(ctx, inFlight)
	require.NoError(t, err)
	require.Equal(t, triesBefore, row.RetryTimes, "the waits used up no attempt")

	_, resumed, err := e.store.ResumeTopic(ctx, "order.created")
	require.NoError(t, err)
	require.True(t, resumed)
	for _, id := range append(held, inFlight) {
		require.Eventually(t, func() bool { return e.status(t, id) == store.StatusSent }, 2*time.Minute, 100*time.Millisecond,
			"message %s is %s after the resume", id, e.status(t, id))
		_, effects := e.recv.Count(id.String())
		require.Equal(t, 1, effects)
	}
	res := describeClosed(t, e.client, "outbox-"+inFlight.String())
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, res.GetWorkflowExecutionInfo().GetStatus())
	tries, _ = e.recv.Count(inFlight.String())
	require.Equal(t, triesBefore+1, tries, "one send after the resume")
	// Its status is back to what it was before the pause, as for any run delivered after a retry.
	e.requireFound(t, inFlight, "ExecutionStatus = 'Completed' AND OutboxStatus = 'retrying'")
}

// requireFound waits until the visibility query (with the message's ID) finds its run.
func (e *env) requireFound(t *testing.T, id uuid.UUID, query string) {
	t.Helper()
	q := fmt.Sprintf("OutboxMessageId = '%s' AND %s", id, query)
	require.Eventually(t, func() bool {
		resp, err := e.client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: e.namespace, Query: q})
		require.NoError(t, err)
		return len(resp.GetExecutions()) == 1
	}, 90*time.Second, 200*time.Millisecond, "%q finds the run", q)
}

// TestPauseTeamActivityTopic: a topic delivered by a team's activity (default policy),
// whose first attempt failed as the topic was paused: its run learns of the pause when it
// records that failure, waits marked paused without calling the team's activity again,
// and after the resume makes its second attempt, which delivers it.
func TestPauseTeamActivityTopic(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "inventory-" + e.store.Schema()
	e.cfg.Topics = map[string]config.Topic{"inventory.reserve": {Activity: "ReserveStock", TaskQueue: teamQueue}}
	team := &inventoryTeam{attempts: map[string][]int{}, reserved: map[string]json.RawMessage{}, answers: map[string][]error{}}
	started := make(chan struct{})
	release := make(chan struct{})
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(func(ctx context.Context, m delivery.Message) error {
			if m.Attempt == 1 {
				close(started)
				<-release // the maintenance begins while this attempt runs
				return temporal.NewApplicationError("stock service in maintenance", "Maintenance")
			}
			return team.ReserveStock(ctx, m)
		}, activity.RegisterOptions{Name: "ReserveStock"})
	})
	e.startWorker(t)
	e.startRelay(t)

	id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "inventory.reserve", Payload: json.RawMessage(`{"sku": "SKU-1"}`)})
	require.NoError(t, err)
	<-started
	_, _, err = e.store.PauseTopic(ctx, "inventory.reserve", "ops", "")
	require.NoError(t, err)
	close(release)

	e.requireFound(t, id, "OutboxStatus = 'paused' AND ExecutionStatus = 'Running'")
	time.Sleep(20 * time.Second) // the pause: a fault of a given length, not a wait for an event
	team.mu.Lock()
	require.Empty(t, team.attempts[id.String()], "no attempt during the pause")
	team.mu.Unlock()
	row, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryTimes, "only the attempt that ran as the pause began")

	_, _, err = e.store.ResumeTopic(ctx, "inventory.reserve")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.status(t, id) == store.StatusSent }, 2*time.Minute, 100*time.Millisecond)
	team.mu.Lock()
	require.Equal(t, []int{2}, team.attempts[id.String()])
	team.mu.Unlock()
}

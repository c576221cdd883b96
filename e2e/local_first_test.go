package e2e

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestFirstAttemptLostWithItsWorker: the first attempt runs as a local activity inside the
// run's first workflow task. When the worker is lost mid-task (here its connection to
// Temporal is cut, so the task never completes), the server times the task out and
// another worker replays it: it must not send a message the row already records as sent,
// and after an attempt whose outcome is unknown it asks check-processed before any resend.
func TestFirstAttemptLostWithItsWorker(t *testing.T) {
	t.Parallel()
	ts := newServer(t)

	for _, tc := range []struct {
		name string
		// checkURL gives the topic a check_url.
		checkURL bool
		// answer is what the lost worker's handler returns after the downstream got the
		// message (and the worker lost Temporal): nil records the row sent.
		answer error
		// processed is the run's DeliveryResult.AlreadyProcessed.
		processed bool
	}{
		{name: "DeliveredAndRecorded", answer: nil},
		{name: "OutcomeUnknownCheckedFirst", checkURL: true, answer: delivery.Ambiguous(errors.New("connection reset after the request was written")), processed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, ts)
			topic := config.Topic{Sink: "http", URL: e.recv.URL + "/events", Timeout: config.Duration(5 * time.Second)}
			if tc.checkURL {
				topic.CheckURL = e.recv.URL + "/events/{message_id}"
			}
			e.cfg.Topics["order.lost"] = topic

			id := loseFirstTask(t, ts, e, "order.lost", tc.answer)
			e.waitStatus(t, id, store.StatusSent)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var res workflows.DeliveryResult
			require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, &res))
			require.Equal(t, tc.processed, res.AlreadyProcessed)
			requests, _ := e.recv.Count(id.String())
			require.Equal(t, 1, requests, "the first attempt's request only: no resend")
			if tc.checkURL {
				require.Positive(t, e.recv.Snapshot().Checks, "check-processed asked the downstream")
			}

			// The history: the first task timed out, then the run went on from the start
			// with check-processed and the send as regular activities.
			types := historyTypes(t, e, id)
			require.Contains(t, types, enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
			for _, a := range sendAttempts(t, e, id) {
				require.False(t, a.local, "no local send in the replayed task")
			}
			require.Contains(t, types, enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
		})
	}
}

// TestLocalFirstAttemptTimesOut: a first attempt that outlasts the topic's timeout ends as
// an ambiguous failure of attempt 1 within the first workflow task; check-processed runs
// before attempt 2, which is a regular activity.
func TestLocalFirstAttemptTimesOut(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	slow := make(chan struct{})
	t.Cleanup(func() { close(slow) })
	var requests atomic.Int32
	e.recv.Handle("POST /slow", func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			select {
			case <-slow:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	e.cfg.Topics["order.slow"] = config.Topic{Sink: "http", URL: e.recv.URL + "/slow", CheckURL: e.recv.URL + "/events/{message_id}",
		Timeout: config.Duration(time.Second), InitialInterval: config.Duration(50 * time.Millisecond)}
	e.startWorker(t)
	e.startRelay(t)
	id, err := e.store.Enqueue(context.Background(), e.pool, store.Message{Topic: "order.slow", Payload: []byte(`{}`)})
	require.NoError(t, err)
	e.waitStatus(t, id, store.StatusSent)
	got := sendAttempts(t, e, id)
	require.Len(t, got, 2, "%+v", got)
	require.True(t, got[0].local)
	require.Contains(t, got[0].failure, "deadline exceeded")
	require.False(t, got[1].local)
	require.Equal(t, 2, got[1].attempt)
	require.Contains(t, historyActivities(t, e, id), workflows.ActivityCheckProcessed, "asked before the resend")
}

// historyTypes lists the event types of a message's latest run.
func historyTypes(t *testing.T, e *env, id uuid.UUID) []enumspb.EventType {
	t.Helper()
	var out []enumspb.EventType
	iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		out = append(out, ev.GetEventType())
	}
	return out
}

// historyActivities lists the activity types a message's latest run scheduled.
func historyActivities(t *testing.T, e *env, id uuid.UUID) []string {
	t.Helper()
	var out []string
	iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			out = append(out, a.GetActivityType().GetName())
		}
	}
	return out
}

// loseFirstTask runs the first attempt of a message of topic on a worker (A) that loses
// Temporal mid-task: it reaches Temporal through a proxy, and its handler sends with the
// topic's sink, then cuts the proxy before it answers (answer; nil records the row sent),
// so the first workflow task never completes. Then it starts the env's worker (B), which
// takes the run once the server times that task out, and the env's relay. It returns the
// message's ID.
func loseFirstTask(t *testing.T, ts *temporaltest.TestServer, e *env, topic string, answer error) uuid.UUID {
	t.Helper()
	// Worker A reaches Temporal through a proxy; its handler sends with the topic's
	// sink, then cuts the proxy before it answers: the local send's workflow task
	// cannot complete.
	proxy := newPGProxy(t, ts.GetFrontendHostPort())
	clientA, err := client.Dial(client.Options{HostPort: proxy.addr, Namespace: e.namespace, Logger: sdklog.NewStructuredLogger(logger)})
	require.NoError(t, err)
	t.Cleanup(clientA.Close)
	sinks, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	sink, ok := sinks.Lookup(topic)
	require.True(t, ok)
	regA := activities.NewRegistry()
	sent := make(chan struct{})
	regA.Handle(topic, delivery.HandlerFunc(func(ctx context.Context, d delivery.Message) error {
		require.Equal(t, 1, d.Attempt)
		require.NoError(t, sink.Send(ctx, d), "the downstream takes the first attempt")
		proxy.down()
		close(sent)
		return answer
	}))
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() {
		doneA <- worker.Run(ctxA, worker.Config{Client: clientA, TaskQueue: e.taskQueue, Deps: worker.Deps{Store: e.store, Handlers: regA, Logger: logger}})
	}()
	t.Cleanup(func() {
		stopA()
		select {
		case <-doneA:
		case <-time.After(30 * time.Second):
			t.Error("worker A did not stop")
		}
	})

	e.startRelay(t)
	id, err := e.store.Enqueue(context.Background(), e.pool, store.Message{Topic: topic, Payload: []byte(`{"order_id": 7}`)})
	require.NoError(t, err)
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("worker A never ran the first attempt")
	}
	if answer == nil {
		// The local send recorded the row before its task was lost.
		e.waitStatus(t, id, store.StatusSent)
	}

	// Worker B takes the run once the server times the first task out.
	e.startWorker(t)
	return id
}

// TestRelayStartsTheVersionEveryWorkerRuns: while a worker of an older outbox (its
// identity names no delivery version: version 3) polls the task queue, the relay starts
// deliveries at version 3, which that worker runs the same way as a newer one (every
// attempt a regular activity), so no worker meets a history it cannot replay during a
// rolling upgrade. A message of a Nexus topic, which version 3 would deliver as a sink's,
// is not started meanwhile: its row waits, claimed, for the older worker to go.
func TestRelayStartsTheVersionEveryWorkerRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.cfg.Topics["orders.nexus"] = config.Topic{Nexus: config.NexusSettings{Endpoint: "orders", Service: "orders", Operation: "deliver"}}
	id, err := e.store.DeploymentID(ctx)
	require.NoError(t, err)
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	w := sdkworker.New(e.client, e.taskQueue, sdkworker.Options{Identity: "1@old@outbox:" + id.String()})
	worker.Register(w, worker.Deps{Store: e.store, Handlers: reg, Logger: logger, Client: e.client, Deployment: id})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	require.Eventually(t, func() bool {
		resp, err := e.client.DescribeTaskQueue(ctx, e.taskQueue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
		return err == nil && len(resp.GetPollers()) > 0
	}, 30*time.Second, 50*time.Millisecond, "the older worker polls")

	e.startRelay(t)
	nexus := e.enqueueOrderPlain(t, "orders.nexus", nil)
	msg := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatus(t, msg, store.StatusSent)
	var in workflows.DeliveryInput
	iter := e.client.GetWorkflowHistory(ctx, workflows.WorkflowID(msg.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	ev, err := iter.Next()
	require.NoError(t, err)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(ev.GetWorkflowExecutionStartedEventAttributes().GetInput(), &in))
	require.Equal(t, 3, in.Version, "the version the older worker runs")
	got := sendAttempts(t, e, msg)
	require.Len(t, got, 1)
	require.False(t, got[0].local, "version 3 sends as a regular activity")

	require.Equal(t, store.StatusClaimed, e.status(t, nexus), "claimed and left for a later claim")
	_, err = e.client.DescribeWorkflowExecution(ctx, workflows.WorkflowID(nexus.String()), "")
	var notFound *serviceerror.NotFound
	require.ErrorAs(t, err, &notFound, "no run of the Nexus topic's message while the older worker polls")
}

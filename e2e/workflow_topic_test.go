package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestWorkflowTopic: a topic that starts a team's workflow on the team's own worker. One
// committed row starts exactly one workflow; a second row whose template gives the same
// workflow ID, after the first workflow completed, counts as delivered without a second
// start; a row whose payload lacks the template's field is dead-lettered with a reason that
// names it; the delivery's history links to the started workflow.
func TestWorkflowTopic(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "fulfilment-" + e.store.Schema()
	e.cfg.Topics["order.created.fulfil"] = config.Topic{
		Workflow: "FulfilOrder", TaskQueue: teamQueue, WorkflowID: "fulfil-" + e.store.Schema() + "-{payload.order_id}",
		InitialInterval: config.Duration(50 * time.Millisecond),
	}
	var mu sync.Mutex
	var runs []delivery.Message
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterWorkflowWithOptions(func(ctx workflow.Context, m delivery.Message) error {
			mu.Lock()
			runs = append(runs, m)
			mu.Unlock()
			return nil
		}, workflow.RegisterOptions{Name: "FulfilOrder"})
	})
	e.startWorker(t)
	e.startRelay(t)

	enqueue := func(payload string) string {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.created.fulfil", Payload: json.RawMessage(payload)})
		require.NoError(t, err)
		return id.String()
	}
	first := enqueue(`{"order_id": 42}`)
	e.waitStatus(t, uuidOf(t, first), store.StatusSent)
	teamID := "fulfil-" + e.store.Schema() + "-42"
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, describeClosed(t, e.client, teamID).GetWorkflowExecutionInfo().GetStatus())

	// The same order again: the workflow ID is the de-duplication key.
	second := enqueue(`{"order_id": 42}`)
	e.waitStatus(t, uuidOf(t, second), store.StatusSent)
	noField := enqueue(`{"sku": "SKU-1"}`)
	e.waitStatus(t, uuidOf(t, noField), store.StatusDead)

	mu.Lock()
	require.Len(t, runs, 1, "one workflow for order 42")
	require.Equal(t, first, runs[0].MessageID)
	require.JSONEq(t, `{"order_id": 42}`, string(runs[0].Payload))
	mu.Unlock()

	dls, err := e.store.DeadLetters(ctx, uuidOf(t, noField))
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Contains(t, dls[0].LastError, `permanent failure: workflow_id template "fulfil-`+e.store.Schema()+`-{payload.order_id}": the payload of message `+noField+` has no field order_id`)

	// The first delivery's history has the child it started, which the UI links.
	var res workflows.DeliveryResult
	require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(first), "").Get(ctx, &res))
	require.NotNil(t, res.Started)
	require.Equal(t, teamID, res.Started.WorkflowID)
	iter := e.client.GetWorkflowHistory(ctx, workflows.WorkflowID(first), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var children []string
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		if a := ev.GetStartChildWorkflowExecutionInitiatedEventAttributes(); a != nil {
			children = append(children, a.GetWorkflowId()+"@"+a.GetTaskQueue().GetName()+" "+a.GetParentClosePolicy().String())
		}
	}
	require.Equal(t, []string{teamID + "@" + teamQueue + " Abandon"}, children)
	var again workflows.DeliveryResult
	require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(second), "").Get(ctx, &again))
	require.Equal(t, &workflows.StartedWorkflow{WorkflowID: teamID}, again.Started, "found started, not started again")
}

// TestSignalTopic: a topic with a signal reaches a running workflow of the team's, and
// starts one (signal-with-start) for an order whose workflow is not running.
func TestSignalTopic(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "payments-" + e.store.Schema()
	prefix := "order-" + e.store.Schema() + "-"
	e.cfg.Topics["order.paid"] = config.Topic{
		Workflow: "OrderLifecycle", TaskQueue: teamQueue, WorkflowID: prefix + "{payload.order_id}", Signal: "paid",
		InitialInterval: config.Duration(50 * time.Millisecond),
	}
	// The team's workflow waits for its order's payment, then completes with the message
	// ID that paid it (whether it was started by the team or by the signal).
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterWorkflowWithOptions(func(ctx workflow.Context, _ *delivery.Message) (string, error) {
			var m delivery.Message
			workflow.GetSignalChannel(ctx, "paid").Receive(ctx, &m)
			return m.MessageID, nil
		}, workflow.RegisterOptions{Name: "OrderLifecycle"})
	})
	e.startWorker(t)
	e.startRelay(t)

	running, err := e.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: prefix + "42", TaskQueue: teamQueue}, "OrderLifecycle", nil)
	require.NoError(t, err)
	paid42, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.paid", Payload: json.RawMessage(`{"order_id": 42}`)})
	require.NoError(t, err)
	paid43, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.paid", Payload: json.RawMessage(`{"order_id": 43}`)})
	require.NoError(t, err)
	e.waitStatus(t, paid42, store.StatusSent)
	e.waitStatus(t, paid43, store.StatusSent)

	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got string
	require.NoError(t, running.Get(waitCtx, &got))
	require.Equal(t, paid42.String(), got, "the signal reached the running workflow")
	require.NoError(t, e.client.GetWorkflow(waitCtx, prefix+"43", "").Get(waitCtx, &got))
	require.Equal(t, paid43.String(), got, "signal-with-start started the workflow with the signal")

	var res workflows.DeliveryResult
	require.NoError(t, e.client.GetWorkflow(waitCtx, workflows.WorkflowID(paid42.String()), "").Get(waitCtx, &res))
	require.Equal(t, &workflows.StartedWorkflow{WorkflowID: prefix + "42", RunID: running.GetRunID()}, res.Started)
}

// TestSignalTopicWhoseWorkflowClosed: a signal for an order whose workflow already
// completed (paid after fulfilment) is not dropped. By default a new run starts with it;
// with workflow_id_reuse: allow_duplicate_failed_only no run may start, and the message
// is dead-lettered with a reason that names the closed run, never counted delivered.
func TestSignalTopicWhoseWorkflowClosed(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "orders-" + e.store.Schema()
	prefix := "order-" + e.store.Schema() + "-"
	e.cfg.Topics["order.paid"] = config.Topic{Workflow: "OrderLifecycle", TaskQueue: teamQueue, WorkflowID: prefix + "{payload.order_id}", Signal: "paid"}
	e.cfg.Topics["order.refunded"] = config.Topic{
		Workflow: "OrderLifecycle", TaskQueue: teamQueue, WorkflowID: prefix + "{payload.order_id}", Signal: "paid",
		WorkflowIDReuse: "allow_duplicate_failed_only",
	}
	received := completeOnFirstSignal(t, e, teamQueue)
	e.startWorker(t)
	e.startRelay(t)

	enqueue := func(topic string) uuid.UUID {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 42}`)})
		require.NoError(t, err)
		return id
	}
	first := enqueue("order.paid")
	e.waitStatus(t, first, store.StatusSent)
	firstRun := describeClosed(t, e.client, prefix+"42").GetWorkflowExecutionInfo()
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, firstRun.GetStatus())

	second := enqueue("order.paid")
	e.waitStatus(t, second, store.StatusSent)
	secondRun := describeClosed(t, e.client, prefix+"42").GetWorkflowExecutionInfo()
	require.NotEqual(t, firstRun.GetExecution().GetRunId(), secondRun.GetExecution().GetRunId(), "a new run received the second signal")

	refunded := enqueue("order.refunded")
	e.waitStatus(t, refunded, store.StatusDead)
	dls, err := e.store.DeadLetters(ctx, refunded)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Contains(t, dls[0].LastError, "signal paid not delivered: workflow "+prefix+"42 is closed (run "+secondRun.GetExecution().GetRunId()+", completed)")

	require.Equal(t, []string{first.String(), second.String()}, received(), "each delivered signal received once; the refund reached no one and says so")
}

// loseFirstSignalResult loses the answer of the first signal-with-start attempt after it
// ran: the signal reached the workflow, the delivery does not know.
type loseFirstSignalResult struct {
	interceptor.WorkerInterceptorBase
}

func (*loseFirstSignalResult) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &loseFirstSignalResultActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}}
}

type loseFirstSignalResultActivity struct {
	interceptor.ActivityInboundInterceptorBase
}

func (a *loseFirstSignalResultActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	res, err := a.Next.ExecuteActivity(ctx, in)
	if err != nil || activity.GetInfo(ctx).ActivityType.Name != workflows.ActivitySignalWithStart {
		return res, err
	}
	var sw workflows.SignalWithStartInput
	if b, merr := json.Marshal(in.Args[0]); merr == nil && json.Unmarshal(b, &sw) == nil && sw.Message.Attempt == 1 {
		return nil, errors.New("the signal's answer was lost")
	}
	return res, err
}

// TestSignalWhoseAnswerWasLost: the first attempt's signal reached the workflow, which
// completed on it, but the answer was lost. The next attempt finds the signal in the
// closed run's history: delivered, with no new run and no second copy.
func TestSignalWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "orders-" + e.store.Schema()
	prefix := "order-" + e.store.Schema() + "-"
	e.cfg.Topics["order.paid"] = config.Topic{Workflow: "OrderLifecycle", TaskQueue: teamQueue, WorkflowID: prefix + "{payload.order_id}", Signal: "paid"}
	received := completeOnFirstSignal(t, e, teamQueue)
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue,
			Options: sdkworker.Options{Interceptors: []interceptor.WorkerInterceptor{&loseFirstSignalResult{}}},
			Deps:    worker.Deps{Store: e.store, Handlers: reg, Logger: logger}})
	})
	e.startRelay(t)

	id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.paid", Payload: json.RawMessage(`{"order_id": 42}`)})
	require.NoError(t, err)
	e.waitStatus(t, id, store.StatusSent)
	row, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryTimes, "the first attempt failed (its answer lost)")

	var res workflows.DeliveryResult
	require.NoError(t, e.client.GetWorkflow(ctx, workflows.WorkflowID(id.String()), "").Get(ctx, &res))
	closed := describeClosed(t, e.client, prefix+"42").GetWorkflowExecutionInfo()
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, closed.GetStatus())
	require.Equal(t, &workflows.StartedWorkflow{WorkflowID: prefix + "42", RunID: closed.GetExecution().GetRunId()}, res.Started,
		"the run the first attempt signalled, still the latest: no new run")
	require.Equal(t, []string{id.String()}, received(), "one copy")
}

// completeOnFirstSignal runs a team's worker on queue with the workflow OrderLifecycle,
// which completes after the first "paid" signal it receives; received returns the message
// IDs its runs received, in order.
func completeOnFirstSignal(t *testing.T, e *env, queue string) (received func() []string) {
	var mu sync.Mutex
	var ids []string
	teamWorker(t, e, queue, func(w sdkworker.Worker) {
		w.RegisterWorkflowWithOptions(func(ctx workflow.Context, _ *delivery.Message) (string, error) {
			var m delivery.Message
			workflow.GetSignalChannel(ctx, "paid").Receive(ctx, &m)
			if !workflow.IsReplaying(ctx) {
				mu.Lock()
				ids = append(ids, m.MessageID)
				mu.Unlock()
			}
			return m.MessageID, nil
		}, workflow.RegisterOptions{Name: "OrderLifecycle"})
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ids)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nexus-rpc/sdk-go/nexus"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	nexuspb "go.temporal.io/api/nexus/v1"
	"go.temporal.io/api/operatorservice/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks/teamnexus"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// buildTemporalServer builds the built-in Temporal server of outbox dev once per test run.
var buildTemporalServer = sync.OnceValues(func() (string, error) {
	root, err := testutil.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(binDir, "outbox-temporal")
	build := exec.Command("go", "build", "-o", bin, "./internal/temporalserver")
	build.Dir = filepath.Join(root, "cmd", "outbox")
	if out, err := build.CombinedOutput(); err != nil {
		return "", errors.New("go build ./cmd/outbox/internal/temporalserver: " + err.Error() + "\n" + string(out))
	}
	return bin, nil
})

// nexusServer starts the built-in Temporal server (the one outbox dev runs) with its
// default flags, which serve the frontend's HTTP API on a free port: Nexus needs it (the
// server hands an operation to the handler's worker through it), and temporaltest's
// server does not serve it. It returns the frontend's address; the server stops when the
// test ends.
func nexusServer(t *testing.T) string {
	t.Helper()
	bin, err := buildTemporalServer()
	require.NoError(t, err)
	ports := testutil.FreePorts(t, 4)
	dir := t.TempDir()
	ready, logFile := filepath.Join(dir, "ready"), filepath.Join(dir, "temporal.log")
	port := func(i int) string { return strconv.Itoa(ports[i]) }
	cmd := exec.Command(bin, "--port", port(0), "--history-port", port(1), "--matching-port", port(2), "--worker-port", port(3),
		"--ui-port", "0", "--ready-file", ready, "--log-file", logFile)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	require.Eventually(t, func() bool {
		_, err := os.Stat(ready)
		return err == nil
	}, 2*time.Minute, 100*time.Millisecond, "the built-in Temporal server did not start; its log is %s", logFile)
	return "127.0.0.1:" + port(0)
}

// dial connects to namespace on the server at address until the test ends.
func dial(t *testing.T, address, namespace string) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: address, Namespace: namespace, Logger: sdklog.NewStructuredLogger(logger)})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// teamNamespace registers namespace, as the team that serves the operations owns one, and
// waits until a worker can poll it.
func teamNamespace(t *testing.T, address, namespace string) client.Client {
	t.Helper()
	ctx := context.Background()
	nc, err := client.NewNamespaceClient(client.Options{HostPort: address, Logger: sdklog.NewStructuredLogger(logger)})
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Register(ctx, &workflowservice.RegisterNamespaceRequest{Namespace: namespace, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour)}))
	c := dial(t, address, namespace)
	require.Eventually(t, func() bool {
		_, err := c.WorkflowService().DescribeTaskQueue(ctx, &workflowservice.DescribeTaskQueueRequest{Namespace: namespace, TaskQueue: &taskqueuepb.TaskQueue{Name: "probe"}})
		return err == nil
	}, time.Minute, 200*time.Millisecond, "namespace %s never became usable", namespace)
	return c
}

// createEndpoint creates Nexus endpoint name, targeting task queue queue of namespace, as
// `temporal operator nexus endpoint create` does.
func createEndpoint(t *testing.T, c client.Client, name, namespace, queue string) {
	t.Helper()
	_, err := c.OperatorService().CreateNexusEndpoint(context.Background(), &operatorservice.CreateNexusEndpointRequest{Spec: &nexuspb.EndpointSpec{
		Name:   name,
		Target: &nexuspb.EndpointTarget{Variant: &nexuspb.EndpointTarget_Worker_{Worker: &nexuspb.EndpointTarget_Worker{Namespace: namespace, TaskQueue: queue}}},
	}})
	require.NoError(t, err)
}

// ordersTeam is the handler a team serves from its own namespace: operation deliver keeps
// one order per message ID and answers as told; operation delivered says whether it has
// the message.
type ordersTeam struct {
	mu       sync.Mutex
	attempts map[string][]int           // message ID → the attempts deliver got
	orders   map[string]json.RawMessage // message ID → payload, once delivered
	answers  map[string][]error         // message ID → errors for its next attempts
	checks   map[string]int             // message ID → checks asked
}

func newOrdersTeam() *ordersTeam {
	return &ordersTeam{attempts: map[string][]int{}, orders: map[string]json.RawMessage{}, answers: map[string][]error{}, checks: map[string]int{}}
}

func (o *ordersTeam) Send(_ context.Context, m delivery.Message) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts[m.MessageID] = append(o.attempts[m.MessageID], m.Attempt)
	if next := o.answers[m.MessageID]; len(next) > 0 {
		o.answers[m.MessageID] = next[1:]
		if next[0] != nil {
			return next[0]
		}
	}
	if _, ok := o.orders[m.MessageID]; !ok {
		o.orders[m.MessageID] = m.Payload
	}
	return nil
}

func (o *ordersTeam) CheckProcessed(_ context.Context, m delivery.Message) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checks[m.MessageID]++
	_, ok := o.orders[m.MessageID]
	return ok, nil
}

// serve runs the team's worker on queue of c's namespace, serving service orders with
// operations deliver and delivered, until the test ends.
func (o *ordersTeam) serve(t *testing.T, c client.Client, queue string) {
	t.Helper()
	svc := nexus.NewService("orders")
	require.NoError(t, svc.Register(teamnexus.Operation("deliver", o), teamnexus.CheckOperation("delivered", o)))
	w := sdkworker.New(c, queue, sdkworker.Options{})
	w.RegisterNexusService(svc)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
}

// nexusEvents lists the Nexus operations of a run's history and how each ended:
// "deliver:COMPLETED", "deliver:FAILED", "deliver:TIMED_OUT".
func nexusEvents(t *testing.T, c client.Client, workflowID string) []string {
	t.Helper()
	iter := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	ops := map[int64]string{}
	var out []string
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		if a := ev.GetNexusOperationScheduledEventAttributes(); a != nil {
			ops[ev.GetEventId()] = a.GetOperation()
		}
		switch {
		case ev.GetNexusOperationCompletedEventAttributes() != nil:
			out = append(out, ops[ev.GetNexusOperationCompletedEventAttributes().GetScheduledEventId()]+":COMPLETED")
		case ev.GetNexusOperationFailedEventAttributes() != nil:
			out = append(out, ops[ev.GetNexusOperationFailedEventAttributes().GetScheduledEventId()]+":FAILED")
		case ev.GetNexusOperationTimedOutEventAttributes() != nil:
			out = append(out, ops[ev.GetNexusOperationTimedOutEventAttributes().GetScheduledEventId()]+":TIMED_OUT")
		}
	}
	return out
}

// TestNexusTopic delivers topics configured with nexus: through a real Temporal server
// with Nexus: the handler runs in a second namespace behind an endpoint, as another team
// serves it. A delivered message costs three actions; a retryable failure is retried
// after the wait it names and recorded on the row; a permanent one dead-letters with its
// reason; a handler that is down for longer than an attempt's timeout (the topic's default
// policy: 30 s) fails the attempt ambiguously, is asked through the check operation once
// it is back, and gets the message once.
func TestNexusTopic(t *testing.T) {
	t.Parallel()
	address := nexusServer(t)
	ctx := context.Background()
	e := newEnvOn(t, dial(t, address, "default"), "default")
	team := teamNamespace(t, address, "orders-team")
	createEndpoint(t, e.client, "orders", "orders-team", "orders-handler")
	createEndpoint(t, e.client, "orders-later", "orders-team", "orders-later")
	e.cfg.Topics["orders.placed"] = config.Topic{
		Nexus:           config.NexusSettings{Endpoint: "orders", Service: "orders", Operation: "deliver", CheckOperation: "delivered", Timeout: config.Duration(10 * time.Second)},
		InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(time.Second),
	}
	// The default policy: 30 s an attempt, 12 attempts, waits from 1 s.
	e.cfg.Topics["orders.later"] = config.Topic{Nexus: config.NexusSettings{Endpoint: "orders-later", Service: "orders", Operation: "deliver", CheckOperation: "delivered"}}
	orders := newOrdersTeam()
	orders.serve(t, team, "orders-handler")
	e.startWorker(t)
	e.startRelay(t)

	enqueue := func(topic string, answers ...error) uuid.UUID {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: topic, Payload: json.RawMessage(`{"order_id": 42}`)})
		require.NoError(t, err)
		orders.mu.Lock()
		orders.answers[id.String()] = answers
		orders.mu.Unlock()
		return id
	}
	delivered := enqueue("orders.placed")
	retried := enqueue("orders.placed", delivery.Retryable(errors.New("orders service busy"), 300*time.Millisecond))
	refused := enqueue("orders.placed", delivery.Permanent(errors.New("order 42 is cancelled")))
	later := enqueue("orders.later")

	e.waitStatus(t, delivered, store.StatusSent)
	e.waitStatus(t, retried, store.StatusSent)
	e.waitStatus(t, refused, store.StatusDead)

	orders.mu.Lock()
	require.Equal(t, []int{1}, orders.attempts[delivered.String()])
	require.Equal(t, []int{1, 2}, orders.attempts[retried.String()], "the retryable failure took one attempt")
	require.Equal(t, []int{1}, orders.attempts[refused.String()], "the permanent failure took the only attempt")
	require.JSONEq(t, `{"order_id": 42}`, string(orders.orders[delivered.String()]))
	require.NotContains(t, orders.orders, refused.String())
	require.Zero(t, orders.checks[retried.String()], "a retryable failure sent nothing: no check")
	orders.mu.Unlock()

	row, err := e.store.Get(ctx, retried)
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryTimes)
	require.NotNil(t, row.LastError)
	require.Equal(t, "orders service busy", *row.LastError)
	dls, err := e.store.DeadLetters(ctx, refused)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "permanent failure: order 42 is cancelled", dls[0].LastError)

	// Each attempt is one operation in the delivery's history.
	require.Equal(t, []string{"deliver:COMPLETED"}, nexusEvents(t, e.client, workflows.WorkflowID(delivered.String())))
	require.Equal(t, []string{"deliver:FAILED", "deliver:COMPLETED"}, nexusEvents(t, e.client, workflows.WorkflowID(retried.String())))
	require.Equal(t, []string{"deliver:FAILED"}, nexusEvents(t, e.client, workflows.WorkflowID(refused.String())))

	// What a delivered message costs: the start, the operation, and the task that records
	// it sent.
	desc := describeClosed(t, e.client, workflows.WorkflowID(delivered.String()))
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	cost, events := historyCost(t, e, workflows.WorkflowID(delivered.String()))
	t.Logf("a delivered message of a Nexus topic: %d actions, %d events: %s", cost.Actions, cost.Events, events)
	require.Equal(t, 3, cost.Actions, events)
	// outbox show lists the operations with their outcomes, as the UI does.
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf("schema: %s\ntemporal:\n  address: %s\n  namespace: default\n  task_queue: %s\n",
		e.store.Schema(), address, e.taskQueue)), 0o600))
	out, code := runOutbox(t, 2*time.Minute, "", map[string]string{"DATABASE_URL": testdb.URL()}, "show", "--config", cfgPath, retried.String())
	require.Zero(t, code, out)
	t.Logf("outbox show %s:\n%s", retried, out)
	require.Regexp(t, `orders/orders/deliver\s+#1\s+nexus\s+failed: orders service busy`, out)
	require.Regexp(t, `orders/orders/deliver\s+#2\s+nexus\s+ok`, out)
	if os.Getenv(recordEnv) == "1" {
		writeHistory(t, e.client, workflows.WorkflowID(retried.String()), "delivery_nexus_retried.json")
	}

	// The handler of orders.later is down: its first attempt runs out of its 30 s.
	require.Eventually(t, func() bool {
		row, err := e.store.Get(ctx, later)
		require.NoError(t, err)
		return row.RetryTimes >= 1
	}, 2*time.Minute, 200*time.Millisecond, "the first attempt to a handler that is down never failed")
	row, err = e.store.Get(ctx, later)
	require.NoError(t, err)
	require.Equal(t, store.StatusDispatched, row.Status)
	require.NotNil(t, row.LastError)
	require.Contains(t, *row.LastError, "Nexus operation orders-later/orders/deliver did not complete within 30s")
	// Back up: the check operation is asked before the message is sent again, once.
	orders.serve(t, team, "orders-later")
	e.waitStatusWithin(t, later, store.StatusSent, 2*time.Minute)
	orders.mu.Lock()
	require.Len(t, orders.attempts[later.String()], 1, "delivered once")
	require.GreaterOrEqual(t, orders.attempts[later.String()][0], 2, "by a later attempt")
	require.Equal(t, 1, orders.checks[later.String()], "asked before the resend")
	orders.mu.Unlock()
	got := nexusEvents(t, e.client, workflows.WorkflowID(later.String()))
	require.Equal(t, "deliver:TIMED_OUT", got[0])
	require.Equal(t, []string{"delivered:COMPLETED", "deliver:COMPLETED"}, got[len(got)-2:])
}

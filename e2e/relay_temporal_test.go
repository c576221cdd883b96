package e2e

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"
	"google.golang.org/grpc"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// The relay against the in-process server: the runs it starts as the server shows them
// (their options, their inputs, a batch's policy), and its answers to what the server
// itself says of a start: a run (running or paused) that already owns the message, a
// refusal that heals, refusals that do not (a denied start, a namespace or search
// attributes that do not exist), an outage of the frontend and a start that hangs.

// faultyServer is an in-process server whose frontend refuses (deny) or holds until the
// caller gives up (hang) the workflow starts in its default namespace while told to; the
// other calls, and the server's own, go through.
type faultyServer struct {
	*temporaltest.TestServer
	deny, hang atomic.Bool
	hung       chan struct{}          // receives once per start held
	namespace  atomic.Pointer[string] // the default namespace, once the server runs
}

// faulty reports whether a call to namespace is one the test's faults apply to.
func (fs *faultyServer) faulty(namespace string) bool {
	ns := fs.namespace.Load()
	return ns != nil && *ns == namespace
}

func newFaultyServer(t *testing.T) *faultyServer {
	t.Helper()
	fs := &faultyServer{hung: make(chan struct{}, 100)}
	const start = "/temporal.api.workflowservice.v1.WorkflowService/StartWorkflowExecution"
	hold := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*workflowservice.StartWorkflowExecutionRequest); ok && info.FullMethod == start && fs.faulty(r.GetNamespace()) && fs.hang.Load() {
			fs.hung <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return handler(ctx, req)
	}
	fs.TestServer = temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(
		temporal.WithAuthorizer(startGate{fs}),
		temporal.WithChainedFrontendGrpcInterceptors(hold),
	))
	ns := fs.GetDefaultNamespace()
	fs.namespace.Store(&ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, temporalx.EnsureSearchAttributes(ctx, fs.GetDefaultClient(), ns))
	return fs
}

// startGate is the server's authorizer: it denies the workflow starts in its namespace
// while the server's deny is set, and allows everything else.
type startGate struct{ fs *faultyServer }

func (g startGate) Authorize(_ context.Context, _ *authorization.Claims, target *authorization.CallTarget) (authorization.Result, error) {
	if g.fs.deny.Load() && g.fs.faulty(target.Namespace) && strings.HasSuffix(target.APIName, "/StartWorkflowExecution") {
		return authorization.Result{Decision: authorization.DecisionDeny, Reason: "the test denies workflow starts"}, nil
	}
	return authorization.Result{Decision: authorization.DecisionAllow}, nil
}

// newRelay builds a relay of the env with its task queue, policies and logger, and short
// poll and lease.
func (e *env) newRelay(t *testing.T) *starter.Relay {
	t.Helper()
	r, err := starter.New(e.store, e.pool, e.client, starter.Config{
		TaskQueue: e.taskQueue, Policy: e.cfg.Policy, Logger: logger,
		PollInterval: 200 * time.Millisecond, Lease: 5 * time.Second,
	})
	require.NoError(t, err)
	return r
}

// runUntilItReturns runs fn until it returns, stop is called or the test ends, and
// returns the channel its result arrives on: for a Run that is expected to stop by itself,
// or whose stop the test times.
func runUntilItReturns(t *testing.T, fn func(context.Context) error) (done <-chan error, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	result := make(chan error, 1)
	go func() { result <- fn(ctx) }()
	return result, cancel
}

// TestRelayMeetsARunThatOwnsTheMessage: the message's workflow ID already has a run open
// (started by an earlier relay whose mark-dispatched was lost, say): the server refuses
// the relay's start as already started, and the relay hands the row to that run rather
// than starting another or leaving it claimed.
func TestRelayMeetsARunThatOwnsTheMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	id := e.enqueueOrderPlain(t, "order.created", nil)
	// The run waits on a task queue nothing polls: open, as a run waiting to retry is.
	run, err := e.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: workflows.WorkflowID(id.String()), TaskQueue: "nobody-polls-" + e.taskQueue,
	}, workflows.WorkflowType, workflows.DeliveryInput{MessageID: id.String()})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	e.startRelayWith(t, e.store, starter.Config{Metrics: m})
	e.waitStatusWithin(t, id, store.StatusDispatched, 30*time.Second)
	desc := e.describe(t, id)
	require.Equal(t, run.GetRunID(), desc.GetWorkflowExecutionInfo().GetExecution().GetRunId(), "the open run keeps the message; no second run")
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, desc.GetWorkflowExecutionInfo().GetStatus())
	require.NoError(t, promtest.GatherAndCompare(reg, strings.NewReader(`
# HELP outbox_workflows_already_started_total Workflow starts that met an existing run of the message's workflow.
# TYPE outbox_workflows_already_started_total counter
outbox_workflows_already_started_total 1
# HELP outbox_workflows_started_total Delivery workflows the relay started.
# TYPE outbox_workflows_started_total counter
outbox_workflows_started_total 0
`), "outbox_workflows_started_total", "outbox_workflows_already_started_total"))
}

// TestRelayMeetsTheRunARedriveStarted: a redriven message's new run waits to retry when
// its row is found pending again (a lost mark-dispatched); the relay's start meets that
// run, not the one that dead-lettered the message, and hands the row to it.
func TestRelayMeetsTheRunARedriveStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.addSlowTopic()
	e.startWorker(t)
	e.startRelay(t)

	e.recv.SetStatus("order.slow", http.StatusBadRequest)
	id := e.enqueueOrderPlain(t, "order.slow", nil)
	e.waitStatus(t, id, store.StatusDead)
	deadLettering := describeClosed(t, e.client, workflows.WorkflowID(id.String())).GetWorkflowExecutionInfo().GetExecution().GetRunId()

	e.recv.SetStatus("order.slow", http.StatusServiceUnavailable) // the redriven run waits an hour to retry
	_, err := e.store.Redrive(ctx, id, "e2e")
	require.NoError(t, err)
	require.Eventually(t, func() bool { requests, _ := e.recv.Count(id.String()); return requests == 2 }, 30*time.Second, 20*time.Millisecond)
	e.waitStatus(t, id, store.StatusDispatched)
	redriven := e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId()
	require.NotEqual(t, deadLettering, redriven)

	e.requireHandedBackTo(t, id, redriven)
	requests, _ := e.recv.Count(id.String())
	require.Equal(t, 2, requests)
}

// TestRelayAsksForACheckFirst: the runs the relay starts ask for check-processed before
// their first send exactly when an earlier send of the message may have happened (a
// failed attempt recorded, a row reconciliation handed back, a redrive), as the real
// server hands their inputs to the workflow.
func TestRelayAsksForACheckFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	table := e.store.Schema() + ".outbox_messages"
	fresh := e.enqueueOrderPlain(t, "order.created", nil)
	failedBefore := e.enqueueOrderPlain(t, "order.created", nil)
	_, err := e.store.RecordFailure(ctx, failedBefore, 1, "HTTP 503")
	require.NoError(t, err)
	handedBack := e.enqueueOrderPlain(t, "order.created", nil)
	_, err = e.pool.Exec(ctx, `UPDATE `+table+` SET dispatched_at = now() - interval '1 hour' WHERE message_id = $1`, handedBack)
	require.NoError(t, err)
	redriven := e.enqueueOrderPlain(t, "order.created", nil)
	_, err = e.pool.Exec(ctx, `UPDATE `+table+` SET redrive_count = 1 WHERE message_id = $1`, redriven)
	require.NoError(t, err)

	e.startWorker(t)
	e.startRelay(t)
	for id, checkFirst := range map[uuid.UUID]bool{fresh: false, failedBefore: true, handedBack: true, redriven: true} {
		e.waitStatus(t, id, store.StatusSent)
		in, _ := runStory(t, e.client, workflows.WorkflowID(id.String()))
		require.Equal(t, checkFirst, in.CheckFirst, "message %s", id)
		requests, _ := e.recv.Count(id.String())
		require.Equal(t, 1, requests, "message %s", id)
	}
}

// TestBatchKeepsThePolicyItsRowsWereHeldUnder: a policy published while a batch's rows
// wait for it (here one that takes the topic out of the batch lane right after the claim
// read it) reaches later claims; the waiting batch's run still starts with its Batch
// settings, and the worker delivers the batch under them.
func TestBatchKeepsThePolicyItsRowsWereHeldUnder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.cfg.Topics["clicks"] = e.cfg.Topics["order.created"]
	var reads atomic.Int32
	policy := func(topic string) workflows.Policy {
		p := e.cfg.Policy(topic)
		if topic == "clicks" && reads.Add(1) == 1 {
			p.Batch = &workflows.BatchPolicy{Size: 100, Wait: 2 * time.Second}
		}
		return p
	}
	e.startWorker(t)
	r, err := starter.New(e.store, e.pool, e.client, starter.Config{TaskQueue: e.taskQueue, Policy: policy, Logger: logger, PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	id := e.enqueueOrderPlain(t, "clicks", nil)
	reads.Store(0) // New checked the policies; the relay's first claim reads it next
	e.run(t, r.Run)

	e.waitStatus(t, id, store.StatusSent)
	batchID := workflows.BatchWorkflowID(id.String())
	desc := describeClosed(t, e.client, batchID)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	it := e.client.GetWorkflowHistory(ctx, batchID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	first, err := it.Next()
	require.NoError(t, err)
	var in workflows.BatchInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(first.GetWorkflowExecutionStartedEventAttributes().GetInput(), &in))
	require.NotNil(t, in.Policy.Batch, "the run has the policy the row was held under")
	require.Equal(t, 100, in.Policy.Batch.Size)
	requests, _ := e.recv.Count(id.String())
	require.Equal(t, 1, requests)

	// A later message is claimed under the policy published since: the message lane.
	later := e.enqueueOrderPlain(t, "clicks", nil)
	e.waitStatus(t, later, store.StatusSent)
	row, err := e.store.Get(ctx, later)
	require.NoError(t, err)
	require.Nil(t, row.BatchID)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED,
		describeClosed(t, e.client, workflows.WorkflowID(later.String())).GetWorkflowExecutionInfo().GetStatus(), "its own delivery run")
}

// TestRelayStartsRunsAsTheServerShowsThem: the runs the relay starts, as the server
// describes them before any worker takes them: on the outbox's task queue, with no
// execution or run timeout (the policy bounds the attempts), the outbox's search
// attributes, and the topic's policy in the input (a row's max_retry_times over the
// topic's attempts). A row a batch had gets a run of its own that checks first, with no
// batch.
func TestRelayStartsRunsAsTheServerShowsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	slow := e.cfg.Topics["order.created"]
	slow.MaxAttempts, slow.InitialInterval = 7, config.Duration(time.Minute)
	e.cfg.Topics["order.slow"] = slow
	zero := 0
	a := e.enqueueOrderPlain(t, "order.slow", nil)
	b := e.enqueueOrderPlain(t, "order.created", &zero)
	batched := e.enqueueOrderPlain(t, "order.created", nil)
	_, err := e.pool.Exec(ctx, `UPDATE `+e.store.Schema()+`.outbox_messages SET batch_id = 'outbox-batch-earlier' WHERE message_id = $1`, batched)
	require.NoError(t, err)
	e.startRelay(t) // no worker: the runs wait for one

	for _, id := range []uuid.UUID{a, b, batched} {
		e.waitStatusWithin(t, id, store.StatusDispatched, 30*time.Second)
		info := e.describe(t, id)
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, info.GetWorkflowExecutionInfo().GetStatus())
		require.Equal(t, e.taskQueue, info.GetWorkflowExecutionInfo().GetTaskQueue())
		require.Zero(t, info.GetExecutionConfig().GetWorkflowExecutionTimeout().AsDuration())
		require.Zero(t, info.GetExecutionConfig().GetWorkflowRunTimeout().AsDuration())
		fields := info.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields()
		for _, name := range workflows.SearchAttributeNames {
			require.Contains(t, fields, name, "message %s", id)
		}
	}
	inA, _ := runStory(t, e.client, workflows.WorkflowID(a.String()))
	require.Equal(t, 7, inA.Policy.MaxAttempts)
	require.Equal(t, time.Minute, inA.Policy.InitialInterval)
	require.True(t, inA.SearchAttributes)
	require.False(t, inA.CheckFirst)
	inB, _ := runStory(t, e.client, workflows.WorkflowID(b.String()))
	require.Equal(t, 1, inB.Policy.MaxAttempts, "max_retry_times 0 is one attempt")
	inBatched, _ := runStory(t, e.client, workflows.WorkflowID(batched.String()))
	require.True(t, inBatched.CheckFirst, "the batch may have sent it")
	row, err := e.store.Get(ctx, batched)
	require.NoError(t, err)
	require.Nil(t, row.BatchID, "its own run has it, not the batch")
}

// TestRelayWhenTemporalRefusesStarts: the server's own refusals, and how the relay tells
// apart one that heals from one that does not.
func TestRelayWhenTemporalRefusesStarts(t *testing.T) {
	t.Parallel()

	t.Run("DeniedStartsAreReportedInOneLineAndRetriedUntilAllowed", func(t *testing.T) {
		t.Parallel()
		fs := newFaultyServer(t)
		e := newEnv(t, fs.TestServer)
		e.startWorker(t)
		fs.deny.Store(true)
		var logs syncBuffer
		r, err := starter.New(e.store, e.pool, e.client, starter.Config{
			TaskQueue: e.taskQueue, Policy: e.cfg.Policy, PollInterval: 200 * time.Millisecond, Lease: 5 * time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		require.NoError(t, err)

		ids := enqueueMany(t, e, "order.created", 20) // one transaction: one pass claims them all
		e.run(t, r.Run)
		require.Eventually(t, func() bool { return r.StartsRefused() != nil }, 30*time.Second, 20*time.Millisecond)
		var denied *serviceerror.PermissionDenied
		require.ErrorAs(t, r.StartsRefused(), &denied, "the refusal the server gave: %v", r.StartsRefused())
		require.ErrorContains(t, r.StartsRefused(), "refused all 20 workflow starts")
		for _, id := range ids {
			require.Equal(t, store.StatusClaimed, e.status(t, id), "a refused row stays claimed until its lease ends")
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		require.Len(t, lines, 1, "the pass's 20 refusals in one line:\n%s", logs.String())
		require.Contains(t, lines[0], "Temporal refused every workflow start of this pass")
		require.Contains(t, lines[0], "refused=20")

		fs.deny.Store(false) // permissions granted before the relay gave up
		e.waitAllSent(t, ids, 60*time.Second)
		for _, id := range ids {
			requests, _ := e.recv.Count(id.String())
			require.Equal(t, 1, requests)
		}
		require.NoError(t, r.StartsRefused(), "starts accepted again: the relay is ready")
	})

	t.Run("ADenialThatLastsStopsTheRelay", func(t *testing.T) {
		t.Parallel()
		fs := newFaultyServer(t)
		e := newEnv(t, fs.TestServer)
		fs.deny.Store(true)
		var denied *serviceerror.PermissionDenied
		require.ErrorAs(t, e.relayGivesUp(t), &denied)
	})

	t.Run("ANamespaceThatDoesNotExistStopsTheRelay", func(t *testing.T) {
		t.Parallel()
		ts := newServer(t)
		c := ts.NewClientWithOptions(client.Options{Namespace: "no-such-namespace"})
		e := newEnvOn(t, c, "no-such-namespace")
		var missing *serviceerror.NamespaceNotFound
		require.ErrorAs(t, e.relayGivesUp(t), &missing)
	})

	t.Run("SearchAttributesNotRegisteredStopTheRelay", func(t *testing.T) {
		t.Parallel()
		ts := temporaltest.NewServer(temporaltest.WithT(t)) // without the outbox's search attributes
		e := newEnv(t, ts)
		var invalid *serviceerror.InvalidArgument
		require.ErrorAs(t, e.relayGivesUp(t), &invalid)
	})
}

// relayGivesUp runs a relay of the env, enqueues a message, and returns the error the
// relay stops with: Temporal refused its starts for a reason that does not heal. The
// message waits, unstarted, for a relay that may start it.
func (e *env) relayGivesUp(t *testing.T) error {
	t.Helper()
	done, _ := runUntilItReturns(t, e.newRelay(t).Run)
	id := e.enqueueOrderPlain(t, "order.created", nil)
	err := waitReturn(t, done, 90*time.Second)
	require.ErrorContains(t, err, "does not heal by waiting")
	require.Contains(t, []store.Status{store.StatusPending, store.StatusClaimed}, e.status(t, id))
	return err
}

// TestRelayRidesOutATemporalOutage: the relay's connection to Temporal is cut for 20
// seconds, under the relay's default settings; its starts fail meanwhile, it does not
// give up, and the message is delivered once Temporal answers again.
func TestRelayRidesOutATemporalOutage(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.startWorker(t)
	proxy := newPGProxy(t, ts.GetFrontendHostPort())
	relayClient, err := client.Dial(client.Options{HostPort: proxy.addr, Namespace: e.namespace, Logger: sdklog.NewStructuredLogger(logger)})
	require.NoError(t, err)
	t.Cleanup(relayClient.Close)
	r, err := starter.New(e.store, e.pool, relayClient, starter.Config{TaskQueue: e.taskQueue, Policy: e.cfg.Policy, Logger: logger})
	require.NoError(t, err)
	done, _ := runUntilItReturns(t, r.Run)

	proxy.down()
	id := e.enqueueOrderPlain(t, "order.created", nil)
	select {
	case err := <-done:
		t.Fatalf("the relay stopped during the outage: %v", err)
	case <-time.After(20 * time.Second):
	}
	require.Contains(t, []store.Status{store.StatusPending, store.StatusClaimed}, e.status(t, id))
	proxy.up(t)
	e.waitStatusWithin(t, id, store.StatusSent, 90*time.Second)
	require.NoError(t, r.StartsRefused())
	requests, _ := e.recv.Count(id.String())
	require.Equal(t, 1, requests)
}

// TestRelayStopsWithinItsGraceWhileAStartHangs: the server holds the relay's start
// without answering; a stop of the relay returns within StopGrace, leaves the row
// claimed for the next relay, and counts no refusal (the stop cut the start short).
func TestRelayStopsWithinItsGraceWhileAStartHangs(t *testing.T) {
	t.Parallel()
	fs := newFaultyServer(t)
	e := newEnv(t, fs.TestServer)
	fs.hang.Store(true)
	r, err := starter.New(e.store, e.pool, e.client, starter.Config{TaskQueue: e.taskQueue, Policy: e.cfg.Policy, Logger: logger})
	require.NoError(t, err)
	done, stop := runUntilItReturns(t, r.Run)

	id := e.enqueueOrderPlain(t, "order.created", nil)
	select {
	case <-fs.hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never started the message's workflow")
	}
	// Without the grace, Run would wait for the start's own timeout (10s by default).
	stop()
	require.NoError(t, waitReturn(t, done, starter.StopGrace+5*time.Second))
	require.Equal(t, store.StatusClaimed, e.status(t, id))
	require.NoError(t, r.StartsRefused(), "a start cut short by the stop is no refusal")
}

// addSlowTopic adds the topic order.slow to the env: an hour between attempts, so a run
// whose attempt failed stays open, waiting to retry, for the rest of the test.
func (e *env) addSlowTopic() {
	e.cfg.Topics["order.slow"] = config.Topic{Sink: "http", URL: e.recv.URL + "/events",
		InitialInterval: config.Duration(time.Hour), Timeout: config.Duration(5 * time.Second)}
}

// startSlowDelivery adds order.slow (addSlowTopic) and runs the env's worker, relay and a
// reconciler that looks at dispatched rows every second.
func (e *env) startSlowDelivery(t *testing.T) {
	t.Helper()
	e.addSlowTopic()
	e.startWorker(t)
	e.startRelay(t)
	e.startReconciler(t, e.store, time.Second, 200*time.Millisecond)
}

// runWaitingToRetry enqueues a message of order.slow (addSlowTopic) while its downstream
// answers 503, and returns it once its run's first attempt failed and the row is
// dispatched: the run now waits an hour to retry.
func (e *env) runWaitingToRetry(t *testing.T) uuid.UUID {
	t.Helper()
	e.recv.SetStatus("order.slow", http.StatusServiceUnavailable)
	id := e.enqueueOrderPlain(t, "order.slow", nil)
	require.Eventually(t, func() bool { requests, _ := e.recv.Count(id.String()); return requests == 1 }, 30*time.Second, 20*time.Millisecond)
	e.waitStatus(t, id, store.StatusDispatched)
	return id
}

// requireHandedBackTo sets the message's dispatched row pending again, as if the relay's
// mark-dispatched had been lost, and requires that the relay's next start, which meets
// the open run runID, hands the row to that run.
func (e *env) requireHandedBackTo(t *testing.T, id uuid.UUID, runID string) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `UPDATE `+e.store.Schema()+`.outbox_messages SET status = 'pending' WHERE message_id = $1`, id)
	require.NoError(t, err)
	e.waitStatusWithin(t, id, store.StatusDispatched, 30*time.Second)
	require.Equal(t, runID, e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId(), "no other run")
}

// waitReturn waits up to within for a result on done.
func waitReturn(t *testing.T, done <-chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("did not return within %s", within)
		return errors.New("unreachable")
	}
}

// TestAPausedRunKeepsItsMessage: an operator pauses a run that waits to retry. A paused
// run is open and goes on once unpaused, so reconciliation leaves its row dispatched, and
// a relay whose start meets it (the row found pending again: a lost mark-dispatched) hands
// the row to it rather than starting another.
func TestAPausedRunKeepsItsMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(
		temporal.WithDynamicConfigClient(dynamicconfig.StaticClient{
			// temporaltest's own setting, which this client replaces.
			dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(): []dynamicconfig.ConstrainedValue{{Value: true}},
			dynamicconfig.WorkflowPauseEnabled.Key():                    []dynamicconfig.ConstrainedValue{{Value: true}},
		})))
	require.NoError(t, temporalx.EnsureSearchAttributes(ctx, ts.GetDefaultClient(), ts.GetDefaultNamespace()))
	e := newEnv(t, ts)
	e.startSlowDelivery(t)

	id := e.runWaitingToRetry(t)
	run := e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId()
	_, err := e.client.WorkflowService().PauseWorkflowExecution(ctx, &workflowservice.PauseWorkflowExecutionRequest{
		Namespace: e.namespace, WorkflowId: workflows.WorkflowID(id.String()), RunId: run, Reason: "an operator looks into it",
		Identity: "e2e", RequestId: uuid.NewString(),
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return e.describe(t, id).GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED
	}, 30*time.Second, 50*time.Millisecond)

	// Reconciliation looks at the row (dispatched longer than a second) many times over.
	time.Sleep(3 * time.Second)
	require.Equal(t, store.StatusDispatched, e.status(t, id))
	audit, err := e.store.Audit(ctx, id)
	require.NoError(t, err)
	require.Empty(t, audit, "reconciliation left the paused run's row alone")

	e.requireHandedBackTo(t, id, run)
	requests, _ := e.recv.Count(id.String())
	require.Equal(t, 1, requests)
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// newReceiver starts an idempotent downstream for the test; it stops when the test ends.
func newReceiver(t *testing.T) *testutil.Receiver {
	r := testutil.NewReceiver()
	t.Cleanup(r.Close)
	return r
}

// env is one isolated outbox: its own schema, task queue and receiver, on a shared
// Temporal server.
type env struct {
	pool      *pgxpool.Pool
	store     *store.Store
	client    client.Client
	namespace string
	taskQueue string
	cfg       *config.Config
	recv      *testutil.Receiver
	handlers  map[string]delivery.Handler // besides the config's, for startWorker
}

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn + 4}))

func newServer(t *testing.T) *temporaltest.TestServer {
	t.Helper()
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, temporalx.EnsureSearchAttributes(ctx, ts.GetDefaultClient(), ts.GetDefaultNamespace()))
	return ts
}

func newEnv(t *testing.T, ts *temporaltest.TestServer) *env {
	t.Helper()
	return newEnvOn(t, ts.GetDefaultClient(), ts.GetDefaultNamespace())
}

// newEnvOn is newEnv on the namespace of client c.
func newEnvOn(t *testing.T, c client.Client, namespace string) *env {
	t.Helper()
	pool, st := testdb.Schema(t)
	recv := newReceiver(t)
	fast := config.Topic{Sink: "http", URL: recv.URL + "/events", InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(200 * time.Millisecond), Timeout: config.Duration(5 * time.Second)}
	cfg := &config.Config{Topics: map[string]config.Topic{"order.created": fast, "order.failing": fast}}
	return &env{
		pool: pool, store: st, client: c, namespace: namespace,
		taskQueue: "outbox-" + st.Schema(), cfg: cfg, recv: recv,
	}
}

// startWorker runs a worker for the env until the test ends.
func (e *env) startWorker(t *testing.T) {
	t.Helper()
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	for topic, h := range e.handlers {
		reg.Handle(topic, h)
	}
	// As outbox worker does: the sinks connect before the worker starts, and close after
	// it stopped (cleanups run last in, first out).
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	require.NoError(t, reg.Open(context.Background()))
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue, Deps: worker.Deps{Store: e.store, Handlers: reg, Logger: logger,
			MaxSendsPerTopic: e.cfg.Worker.MaxSendsPerTopic}})
	})
}

// startRelay runs a relay for the env until the test ends.
func (e *env) startRelay(t *testing.T) {
	t.Helper()
	e.startRelayWith(t, e.store, starter.Config{})
}

// startRelayWith runs a relay on st for the env until the test ends: cfg with the env's
// task queue, policies and logger, and short poll and lease.
func (e *env) startRelayWith(t *testing.T, st *store.Store, cfg starter.Config) {
	t.Helper()
	cfg.TaskQueue, cfg.Policy, cfg.Logger = e.taskQueue, e.cfg.Policy, logger
	cfg.PollInterval, cfg.Lease = 200*time.Millisecond, 5*time.Second
	r, err := starter.New(st, e.pool, e.client, cfg)
	require.NoError(t, err)
	e.run(t, r.Run)
}

// startReconciler runs a reconciler of st's rows, as outbox relay runs one beside each
// relay, looking at rows dispatched longer than after, every interval.
func (e *env) startReconciler(t *testing.T, st *store.Store, after, interval time.Duration) {
	t.Helper()
	rc, err := starter.NewReconciler(st, e.client, starter.ReconcilerConfig{After: after, Interval: interval, Logger: logger})
	require.NoError(t, err)
	e.run(t, rc.Run)
}

// run runs fn until the returned stop is called or the test ends, whichever comes first;
// stop cancels fn's context and requires fn to return nil within 30s.
func (e *env) run(t *testing.T, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("did not stop within 30s of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// enqueueOrder writes a business row and its message in one transaction.
func (e *env) enqueueOrder(t *testing.T, topic string, n int, maxRetryTimes *int) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+e.store.Schema()+`.orders (n) VALUES ($1)`, n)
	require.NoError(t, err)
	id, err := e.store.Enqueue(ctx, tx, store.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"order": %d}`, n)), MaxRetryTimes: maxRetryTimes})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return id
}

func (e *env) createOrders(t *testing.T) {
	_, err := e.pool.Exec(context.Background(), `CREATE TABLE `+e.store.Schema()+`.orders (id serial PRIMARY KEY, n int)`)
	require.NoError(t, err)
}

func (e *env) status(t *testing.T, id uuid.UUID) store.Status {
	row, err := e.store.Get(context.Background(), id)
	require.NoError(t, err)
	return row.Status
}

func (e *env) waitStatus(t *testing.T, id uuid.UUID, status store.Status) {
	t.Helper()
	e.waitStatusWithin(t, id, status, 60*time.Second)
}

func (e *env) waitStatusWithin(t *testing.T, id uuid.UUID, status store.Status, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return e.status(t, id) == status }, within, 50*time.Millisecond,
		"message %s never became %s", id, status)
}

// describeClosed waits for the workflow's current run to close (a row is recorded sent
// before its workflow's last step) and describes it.
func describeClosed(t *testing.T, c client.Client, workflowID string) *workflowservice.DescribeWorkflowExecutionResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = c.GetWorkflow(ctx, workflowID, "").Get(ctx, nil) // its outcome is in the description
	desc, err := c.DescribeWorkflowExecution(ctx, workflowID, "")
	require.NoError(t, err)
	return desc
}

func (e *env) describe(t *testing.T, id uuid.UUID) *workflowservice.DescribeWorkflowExecutionResponse {
	desc, err := e.client.DescribeWorkflowExecution(context.Background(), workflows.WorkflowID(id.String()), "")
	require.NoError(t, err)
	return desc
}

func TestDelivery(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()

	t.Run("BusinessTransactionsAllDelivered", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.createOrders(t)
		e.startWorker(t)
		e.startRelay(t)
		const n = 200
		ids := make([]uuid.UUID, n)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 4 {
					ids[i] = e.enqueueOrder(t, "order.created", i, nil)
				}
			}()
		}
		wg.Wait()
		require.Eventually(t, func() bool {
			var sent int
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages WHERE status = 'sent'`).Scan(&sent))
			return sent == n
		}, 120*time.Second, 100*time.Millisecond)
		requests, effects := e.recv.Totals()
		require.Equal(t, n, effects)
		require.Equal(t, n, requests, "no message was sent twice")
		for _, id := range ids {
			require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, describeClosed(t, e.client, workflows.WorkflowID(id.String())).GetWorkflowExecutionInfo().GetStatus())
		}

		// The delivery is found in the UI by topic and status, as the README searches: a
		// completed run is a sent message.
		require.Eventually(t, func() bool {
			resp, err := e.client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
				Namespace: e.namespace,
				Query:     fmt.Sprintf("OutboxMessageId = '%s' AND OutboxTopic = 'order.created' AND ExecutionStatus = 'Completed'", ids[0]),
			})
			require.NoError(t, err)
			return len(resp.GetExecutions()) == 1
		}, 30*time.Second, 100*time.Millisecond)
	})

	t.Run("PlainSQLRowsDelivered", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		var id uuid.UUID
		require.NoError(t, e.pool.QueryRow(ctx, `INSERT INTO `+e.store.Schema()+`.outbox_messages (topic, payload)
			VALUES ('order.created', '{"from": "php"}') RETURNING message_id`).Scan(&id))
		e.waitStatus(t, id, store.StatusSent)
		requests, effects := e.recv.Count(id.String())
		require.Equal(t, 1, requests)
		require.Equal(t, 1, effects)
	})

	t.Run("AlwaysFailingDownstreamDeadLetters", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		e.recv.SetStatus("order.failing", http.StatusInternalServerError)
		two := 2
		for _, tc := range []struct {
			name          string
			maxRetryTimes *int
			status        int
			requests      int
		}{
			{"NullMaxRetryTimesGivesTheDefaultAttempts", nil, 500, workflows.DefaultMaxAttempts},
			{"MaxRetryTimesTwoGivesThree", &two, 500, 3},
		} {
			t.Run(tc.name, func(t *testing.T) {
				id := e.enqueueOrderPlain(t, "order.failing", tc.maxRetryTimes)
				e.waitStatus(t, id, store.StatusDead)
				requests, effects := e.recv.Count(id.String())
				require.Equal(t, tc.requests, requests)
				require.Zero(t, effects)
				dls, err := e.store.DeadLetters(ctx, id)
				require.NoError(t, err)
				require.Len(t, dls, 1)
				require.Equal(t, tc.requests, dls[0].Attempts)
				require.Contains(t, dls[0].LastError, "HTTP 500")
				row, err := e.store.Get(ctx, id)
				require.NoError(t, err)
				require.Equal(t, tc.requests, row.RetryTimes)

				desc := describeClosed(t, e.client, workflows.WorkflowID(id.String()))
				require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, desc.GetWorkflowExecutionInfo().GetStatus())
				require.Equal(t, dls[0].RunID, desc.GetWorkflowExecutionInfo().GetExecution().GetRunId())
			})
		}
	})

	t.Run("BadRequestDeadLettersAfterOneRequest", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		e.recv.SetStatus("order.failing", http.StatusBadRequest)
		id := e.enqueueOrderPlain(t, "order.failing", nil)
		e.waitStatus(t, id, store.StatusDead)
		requests, _ := e.recv.Count(id.String())
		require.Equal(t, 1, requests)
		dls, err := e.store.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Contains(t, dls[0].LastError, "permanent failure")
	})

	t.Run("UnknownTopicDeadLetters", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		one := 1 // retried through its two attempts (a worker deployed later may know it)
		id := e.enqueueOrderPlain(t, "order.unrouted", &one)
		e.waitStatus(t, id, store.StatusDead)
		dls, err := e.store.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Equal(t, 2, dls[0].Attempts)
		require.Contains(t, dls[0].LastError, `gave up after 2 attempts: no handler for topic "order.unrouted"`)
	})

	t.Run("LostMarkSentIsRecoveredWithoutResending", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		id := e.enqueueOrderPlain(t, "order.created", nil)
		e.waitStatus(t, id, store.StatusSent)
		run := e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId()

		// As if mark-sent had been lost: the row is pending again.
		_, err := e.pool.Exec(ctx, `UPDATE `+e.store.Schema()+`.outbox_messages
			SET status = 'pending', sent_at = NULL WHERE message_id = $1`, id)
		require.NoError(t, err)
		e.waitStatus(t, id, store.StatusSent)
		requests, _ := e.recv.Count(id.String())
		require.Equal(t, 1, requests, "the completed run is not repeated")
		require.Equal(t, run, e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId(), "no second run")
	})

	t.Run("TwoRelaysDeliverEachMessageOnce", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, ts)
		e.startWorker(t)
		e.startRelay(t)
		e.startRelay(t)
		const n = 100
		ids := make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = e.enqueueOrderPlain(t, "order.created", nil)
		}
		for _, id := range ids {
			e.waitStatus(t, id, store.StatusSent)
		}
		for _, id := range ids {
			requests, effects := e.recv.Count(id.String())
			require.Equal(t, 1, requests, "message %s", id)
			require.Equal(t, 1, effects)
		}
	})
}

// enqueueOrderPlain enqueues a message outside any business transaction.
func (e *env) enqueueOrderPlain(t *testing.T, topic string, maxRetryTimes *int) uuid.UUID {
	t.Helper()
	id, err := e.store.Enqueue(context.Background(), e.pool, store.Message{
		Topic: topic, Payload: json.RawMessage(`{"k": ` + strconv.Itoa(int(time.Now().UnixNano()%1000)) + `}`), MaxRetryTimes: maxRetryTimes,
	})
	require.NoError(t, err)
	return id
}

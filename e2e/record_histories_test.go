package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// recordEnv names the environment variable that makes TestRecordHistories write the
// replay test's histories.
const recordEnv = "OUTBOX_RECORD_HISTORIES"

// recordGeneration names the folder of workflows/testdata that TestRecordHistories
// writes. The replay test replays every generation, so when a change to OutboxDelivery adds
// a path or changes its input, bump this and record: the older generations stay, guarded.
const recordGeneration = "v11"

// historiesDir is where workflows/replay_test.go reads the recorded histories from.
var historiesDir = filepath.Join("..", "workflows", "testdata", recordGeneration)

// TestRecordHistories runs OutboxDelivery through its main paths against the in-process
// Temporal server and writes each run's history as JSON (the format the Temporal CLI
// exports and worker.WorkflowReplayer reads) to workflows/testdata/<recordGeneration>,
// where the replay test checks that the current workflow code still replays them.
func TestRecordHistories(t *testing.T) {
	if os.Getenv(recordEnv) != "1" {
		t.Skipf("set %s=1 to record the workflow histories: %s=1 go test -count=1 -run TestRecordHistories ./e2e/", recordEnv, recordEnv)
	}
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()

	// fast returns a topic on the env's receiver with short waits between attempts.
	fast := func(e *env) config.Topic {
		return config.Topic{Sink: "http", URL: e.recv.URL + "/events",
			InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(200 * time.Millisecond),
			Timeout: config.Duration(5 * time.Second)}
	}

	// handedOver runs a batch of three whose second message the downstream refuses once,
	// and returns that message.
	handedOver := func(t *testing.T, e *env) uuid.UUID {
		topic := fast(e)
		topic.Lane = config.LaneBatch
		e.cfg.Topics["page.viewed"] = topic
		ids := enqueueMany(t, e, "page.viewed", 3)
		e.recv.Before = flaky(e.recv, map[string]int{ids[1].String(): 1})
		e.start(t)
		e.waitAllSent(t, ids, time.Minute)
		return ids[1]
	}
	// batchOf is the workflow ID of the batch run a message was handed to.
	batchOf := func(t *testing.T, e *env, id uuid.UUID) string {
		row, err := e.store.Get(ctx, id)
		require.NoError(t, err)
		require.NotNil(t, row.BatchID, "message %s was handed to a batch", id)
		return *row.BatchID
	}
	for _, sc := range []struct {
		file string
		// run sets the env up, enqueues one message and waits for its row's final status.
		run func(t *testing.T, e *env) uuid.UUID
		// failed says whether the run ends failed (dead-lettered).
		failed bool
		// workflowID is the run to record, when it is not the message's own
		// (workflows.WorkflowID): its batch, for instance.
		workflowID func(t *testing.T, e *env, id uuid.UUID) string
	}{
		{
			file: "batch_sent.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// A topic of the batch lane: the batch delivers its three messages.
				topic := fast(e)
				topic.Lane = config.LaneBatch
				e.cfg.Topics["page.viewed"] = topic
				ids := enqueueMany(t, e, "page.viewed", 3)
				e.start(t)
				e.waitAllSent(t, ids, time.Minute)
				return ids[0]
			},
			workflowID: batchOf,
		},
		{
			// The downstream refuses one message of the batch once: it leaves the batch
			// for a run of its own, which delivers it at its second attempt.
			file:       "batch_handed_over.json",
			run:        handedOver,
			workflowID: batchOf,
		},
		{
			// That message's own run: it goes on from the batch's attempt.
			file: "delivery_from_batch.json",
			run:  handedOver,
		},
		{
			file: "delivery_success.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.created", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_retries_then_success.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				e.cfg.Topics["order.flaky"] = fast(e)
				e.recv.SetStatus("order.flaky", http.StatusServiceUnavailable) // retryable, not ambiguous
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.flaky", nil)
				require.Eventually(t, func() bool {
					row, err := e.store.Get(ctx, id)
					require.NoError(t, err)
					return row.RetryTimes >= 2
				}, 60*time.Second, 10*time.Millisecond)
				e.recv.ClearStatus("order.flaky")
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.Count(id.String())
				require.GreaterOrEqual(t, requests, 3)
				return id
			},
		},
		{
			file: "delivery_dead_letter.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// 500 is ambiguous; without a check_url check-processed is unsupported, so
				// the history holds a send, a timer, a check, a second send and the dead letter.
				e.recv.SetStatus("order.failing", http.StatusInternalServerError)
				e.start(t)
				one := 1
				id := e.enqueueOrderPlain(t, "order.failing", &one)
				e.waitStatus(t, id, store.StatusDead)
				return id
			},
			failed: true,
		},
		{
			file: "delivery_check_processed_skip.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(http.StatusOK) // the downstream has the message
				}))
				t.Cleanup(check.Close)
				topic := fast(e)
				topic.CheckURL = check.URL + "/events/{message_id}"
				e.cfg.Topics["order.checked"] = topic
				e.recv.SetStatus("order.checked", http.StatusInternalServerError) // ambiguous
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.checked", nil)
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.Count(id.String())
				require.Equal(t, 1, requests, "check-processed said processed: no second send")
				return id
			},
		},
		{
			file: "delivery_last_ambiguous_checked.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// One attempt, failing ambiguously (500); check_url says the receiver has
				// it, so it is recorded sent instead of dead-lettered.
				check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
				t.Cleanup(check.Close)
				topic := fast(e)
				topic.CheckURL = check.URL + "/events/{message_id}"
				e.cfg.Topics["order.lastchecked"] = topic
				e.recv.SetStatus("order.lastchecked", http.StatusInternalServerError)
				e.start(t)
				zero := 0
				id := e.enqueueOrderPlain(t, "order.lastchecked", &zero)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_unanswered_check_kept.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// Two attempts: the first fails ambiguously (500), the check after it cannot
				// answer (503), the second fails cleanly (503). The first may have reached
				// the receiver, so the run checks again before it would dead-letter, and the
				// receiver has the message by then: it is recorded sent. The run records the
				// unanswered-check-kept marker.
				var id uuid.UUID
				check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					if requests, _ := e.recv.Count(id.String()); requests < 2 {
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					w.WriteHeader(http.StatusOK)
				}))
				t.Cleanup(check.Close)
				topic := fast(e)
				topic.CheckURL = check.URL + "/events/{message_id}"
				e.cfg.Topics["order.unanswered"] = topic
				e.recv.Before = func(w http.ResponseWriter, req *http.Request) bool {
					if requests, _ := e.recv.Count(req.Header.Get("Idempotency-Key")); requests <= 1 {
						http.Error(w, "lost", http.StatusInternalServerError)
					} else {
						http.Error(w, "busy", http.StatusServiceUnavailable)
					}
					return true
				}
				one := 1
				id = e.enqueueOrderPlain(t, "order.unanswered", &one)
				e.start(t)
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.Count(id.String())
				require.Equal(t, 2, requests)
				return id
			},
		},
		{
			file: "delivery_dead_letter_found_sent.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// One attempt, which the receiver took and answered 500 after the row was
				// recorded sent (as when the send's answer is lost after it recorded the
				// row): the dead-letter step finds the row sent, writes no dead letter, and
				// the run ends delivered.
				e.cfg.Topics["order.answerlost"] = fast(e)
				e.recv.Before = func(w http.ResponseWriter, req *http.Request) bool {
					id, err := uuid.Parse(req.Header.Get("Idempotency-Key"))
					require.NoError(t, err)
					_, err = e.store.RecordSent(ctx, id)
					require.NoError(t, err)
					http.Error(w, "answer lost", http.StatusInternalServerError)
					return true
				}
				zero := 0
				id := e.enqueueOrderPlain(t, "order.answerlost", &zero)
				e.start(t)
				e.waitStatus(t, id, store.StatusSent)
				dls, err := e.store.DeadLetters(ctx, id)
				require.NoError(t, err)
				require.Empty(t, dls)
				return id
			},
		},
		{
			file: "delivery_unknown_topic_dead_letter.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// No worker knows the topic: retried through its two attempts, then
				// dead-lettered.
				e.start(t)
				one := 1
				id := e.enqueueOrderPlain(t, "order.nobody", &one)
				e.waitStatus(t, id, store.StatusDead)
				return id
			},
			failed: true,
		},
		{
			file: "delivery_check_first.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// A row handed over before (dispatched_at set): the run asks check_url
				// before it sends, and the receiver has it.
				check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
				t.Cleanup(check.Close)
				topic := fast(e)
				topic.CheckURL = check.URL + "/events/{message_id}"
				e.cfg.Topics["order.again"] = topic
				id := e.enqueueOrderPlain(t, "order.again", nil)
				_, err := e.pool.Exec(ctx, `UPDATE `+e.store.Schema()+`.outbox_messages SET dispatched_at = now() - interval '1 hour' WHERE message_id = $1`, id)
				require.NoError(t, err)
				e.start(t)
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.Count(id.String())
				require.Zero(t, requests)
				return id
			},
		},
		{
			file: "delivery_store_outage.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// The worker's database is away at the first send: the attempt is not used
				// up; the same attempt succeeds once the database is back.
				workerStore, proxy := proxiedStore(t, e)
				e.startWorkerWith(t, workerStore)
				// Past its start (which waits for a database that does not answer), the
				// worker polls; then its database goes away.
				require.Eventually(t, func() bool {
					resp, err := e.client.DescribeTaskQueue(context.Background(), e.taskQueue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
					return err == nil && len(resp.GetPollers()) > 0
				}, 30*time.Second, 50*time.Millisecond, "the worker polls")
				proxy.down()
				e.startRelay(t)
				id := e.enqueueOrderPlain(t, "order.created", nil)
				waitActivityFailed(t, e, id)
				proxy.up(t)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_unrecorded.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// The worker's database goes away right after the send: mark-sent gives up
				// after MarkSentTimeout and the run completes delivered, not recorded.
				workerStore, proxy := proxiedStore(t, e)
				cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { proxy.down() }))
				t.Cleanup(cut.Close)
				e.cfg.Topics["order.cut"] = config.Topic{Sink: "http", URL: cut.URL, MarkSentTimeout: config.Duration(2 * time.Second)}
				e.startWorkerWith(t, workerStore)
				e.startRelay(t)
				id := e.enqueueOrderPlain(t, "order.cut", nil)
				require.Eventually(t, func() bool { return e.status(t, id) == store.StatusDispatched }, 30*time.Second, 20*time.Millisecond)
				var res workflows.DeliveryResult
				waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
				defer cancel()
				require.NoError(t, e.client.GetWorkflow(waitCtx, workflows.WorkflowID(id.String()), "").Get(waitCtx, &res))
				require.True(t, res.Unrecorded)
				return id
			},
		},
		{
			file: "delivery_first_task_lost.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// The local first attempt reached the downstream and its worker lost
				// Temporal before its task completed; another worker takes the run after the
				// task timed out, asks check_url (which has it) and records it sent.
				topic := fast(e)
				topic.CheckURL = e.recv.URL + "/events/{message_id}"
				e.cfg.Topics["order.lost"] = topic
				id := loseFirstTask(t, ts, e, "order.lost", delivery.Ambiguous(errors.New("connection reset after the request was written")))
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_first_attempt_activity.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// first_attempt: activity: every attempt a regular activity; the send records
				// the row, so no mark-sent step.
				topic := fast(e)
				topic.FirstAttempt = workflows.FirstAttemptActivity
				e.cfg.Topics["order.regular"] = topic
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.regular", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_team_activity_retried.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// A topic delivered by a team's activity on its own task queue: the first
				// attempt fails with a retryable error that asks for a delay.
				queue := "team-" + e.store.Schema()
				e.cfg.Topics["inventory.reserve"] = config.Topic{Activity: "ReserveStock", TaskQueue: queue, CheckActivity: "HasReservation",
					InitialInterval: config.Duration(50 * time.Millisecond)}
				var calls atomic.Int32
				teamWorker(t, e, queue, func(w sdkworker.Worker) {
					w.RegisterActivityWithOptions(func(context.Context, delivery.Message) error {
						if calls.Add(1) == 1 {
							return temporal.NewApplicationErrorWithOptions("busy", "Busy", temporal.ApplicationErrorOptions{NextRetryDelay: 100 * time.Millisecond})
						}
						return nil
					}, activity.RegisterOptions{Name: "ReserveStock"})
				})
				e.start(t)
				id := e.enqueueOrderPlain(t, "inventory.reserve", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_team_paused_last_attempt.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// A topic delivered by a team's activity, with one attempt, paused while that
				// attempt runs: the attempt fails, and the run, finding the topic paused when
				// it records the failure, waits for the resume (a second later) and makes the
				// attempt again, which delivers the message.
				queue := "team-" + e.store.Schema()
				e.cfg.Topics["inventory.hold"] = config.Topic{Activity: "HoldStock", TaskQueue: queue, MaxAttempts: 1,
					InitialInterval: config.Duration(50 * time.Millisecond)}
				var calls atomic.Int32
				teamWorker(t, e, queue, func(w sdkworker.Worker) {
					w.RegisterActivityWithOptions(func(ctx context.Context, _ delivery.Message) error {
						if calls.Add(1) > 1 {
							return nil
						}
						if _, _, err := e.store.PauseTopic(ctx, "inventory.hold", "ops", "stock count"); err != nil {
							return err
						}
						time.AfterFunc(time.Second, func() {
							if _, _, err := e.store.ResumeTopic(context.Background(), "inventory.hold"); err != nil {
								t.Errorf("resume inventory.hold: %v", err)
							}
						})
						return errors.New("stock count under way")
					}, activity.RegisterOptions{Name: "HoldStock"})
				})
				e.start(t)
				id := e.enqueueOrderPlain(t, "inventory.hold", nil)
				e.waitStatus(t, id, store.StatusSent)
				require.EqualValues(t, 2, calls.Load(), "the one attempt, made again after the resume")
				return id
			},
		},
		{
			file: "delivery_team_workflow_started.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				queue := "team-" + e.store.Schema()
				e.cfg.Topics["order.fulfil"] = config.Topic{Workflow: "FulfilOrder", TaskQueue: queue, WorkflowID: "fulfil-{message_id}"}
				teamWorker(t, e, queue, func(w sdkworker.Worker) {
					w.RegisterWorkflowWithOptions(func(workflow.Context, delivery.Message) error { return nil }, workflow.RegisterOptions{Name: "FulfilOrder"})
				})
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.fulfil", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			// A backoff whose product no Duration holds (a coefficient of 1e12): the third
			// attempt waits max_interval, and the run records the backoff-overflow-capped
			// marker.
			file: "delivery_backoff_capped.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				topic := fast(e)
				topic.Backoff = 1e12
				e.cfg.Topics["order.capped"] = topic
				id := e.enqueueOrderPlain(t, "order.capped", nil)
				e.recv.Before = flaky(e.recv, map[string]int{id.String(): 2})
				e.start(t)
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.Count(id.String())
				require.Equal(t, 3, requests)
				return id
			},
		},
		{
			// A workflow topic whose workflow_id renders more than Temporal's 1000 bytes:
			// dead-lettered at once, and the run records the team-workflow-id-checked marker.
			file: "delivery_team_workflow_id_refused.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				queue := "team-" + e.store.Schema()
				e.cfg.Topics["order.fulfil"] = config.Topic{Workflow: "FulfilOrder", TaskQueue: queue, WorkflowID: "fulfil-{payload.ref}"}
				e.start(t)
				id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.fulfil",
					Payload: json.RawMessage(`{"ref": "` + strings.Repeat("r", 1000) + `"}`)})
				require.NoError(t, err)
				e.waitStatus(t, id, store.StatusDead)
				row, err := e.store.Get(ctx, id)
				require.NoError(t, err)
				require.Contains(t, *row.LastError, "renders an ID of 1007 bytes, over Temporal's limit of 1000")
				return id
			},
			failed: true,
		},
		{
			file: "delivery_team_workflow_signalled.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				queue := "team-" + e.store.Schema()
				e.cfg.Topics["order.paid"] = config.Topic{Workflow: "OrderLifecycle", TaskQueue: queue, WorkflowID: "paid-{message_id}", Signal: "paid"}
				teamWorker(t, e, queue, func(w sdkworker.Worker) {
					w.RegisterWorkflowWithOptions(func(ctx workflow.Context, _ delivery.Message) error {
						workflow.GetSignalChannel(ctx, "paid").Receive(ctx, nil)
						return nil
					}, workflow.RegisterOptions{Name: "OrderLifecycle"})
				})
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.paid", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
	} {
		t.Run(sc.file, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, ts)
			id := sc.run(t, e)
			wid := workflows.WorkflowID(id.String())
			if sc.workflowID != nil {
				wid = sc.workflowID(t, e, id)
			}

			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			var res workflows.DeliveryResult
			err := e.client.GetWorkflow(waitCtx, wid, "").Get(waitCtx, &res)
			if sc.failed {
				require.ErrorContains(t, err, workflows.ErrTypeDeadLettered)
			} else {
				require.NoError(t, err)
			}

			writeHistory(t, e.client, wid, sc.file)
		})
	}
}

// writeHistory writes the history of workflowID's latest run as JSON to file in
// historiesDir, for the replay test.
func writeHistory(t *testing.T, c client.Client, workflowID, file string) {
	t.Helper()
	hist := &historypb.History{}
	iter := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		hist.Events = append(hist.Events, ev)
	}
	require.NotEmpty(t, hist.Events)
	data, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(hist)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(historiesDir, 0o755))
	path := filepath.Join(historiesDir, file)
	require.NoError(t, os.WriteFile(path, append(data, '\n'), 0o644))
	t.Logf("wrote %s (%d events)", path, len(hist.Events))
}

// start runs the env's worker and relay.
func (e *env) start(t *testing.T) {
	t.Helper()
	e.startWorker(t)
	e.startRelay(t)
}

// proxiedStore returns a Store on the env's schema that reaches PostgreSQL through a proxy
// the test can cut.
func proxiedStore(t *testing.T, e *env) (*store.Store, *pgProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	proxy := newPGProxy(t, target)
	cfg, err = pgxpool.ParseConfig(strings.Replace(testdb.URL(), target, proxy.addr, 1))
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: e.store.Schema()})
	require.NoError(t, err)
	return st, proxy
}

// startWorkerWith runs a worker for the env on st until the test ends.
func (e *env) startWorkerWith(t *testing.T, st *store.Store) {
	t.Helper()
	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue, Deps: worker.Deps{Store: st, Handlers: reg, Logger: logger}})
	})
}

// waitActivityFailed waits until the message's workflow history holds a failed activity.
func waitActivityFailed(t *testing.T, e *env, id uuid.UUID) {
	t.Helper()
	require.Eventually(t, func() bool {
		iter := e.client.GetWorkflowHistory(context.Background(), workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for iter.HasNext() {
			ev, err := iter.Next()
			if err != nil {
				return false
			}
			if ev.GetEventType() == enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED {
				return true
			}
		}
		return false
	}, 60*time.Second, 50*time.Millisecond)
}

package e2e

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// retentionConfig is the env's config with retention enabled, as `outbox worker` reads it.
func (e *env) retentionConfig(ts *temporaltest.TestServer, r config.Retention) *config.Config {
	r.Enabled = true
	return &config.Config{
		DatabaseURL: testdb.URL(),
		Schema:      e.store.Schema(),
		Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
		Retention:   r,
		Topics:      e.cfg.Topics,
	}
}

// startAppWorker runs the worker as `outbox worker` does (app.RunWorker) until the test
// ends. It starts once gate is closed.
func (e *env) startAppWorker(t *testing.T, cfg *config.Config, gate <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	a, err := app.Open(ctx, cfg, app.Options{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	require.NoError(t, a.DialTemporal(ctx))
	e.run(t, func(ctx context.Context) error {
		<-gate
		return a.RunWorker(ctx, app.Handlers{})
	})
}

// describeRetention waits for the retention schedule of taskQueue's outbox and describes it.
func describeRetention(t *testing.T, c client.Client, taskQueue string) *client.ScheduleDescription {
	t.Helper()
	id := workflows.RetentionScheduleFor(taskQueue)
	var desc *client.ScheduleDescription
	require.Eventually(t, func() bool {
		var err error
		desc, err = c.ScheduleClient().GetHandle(context.Background(), id).Describe(context.Background())
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "schedule %s never appeared", id)
	return desc
}

func scheduleInput(t *testing.T, desc *client.ScheduleDescription) workflows.RetentionInput {
	t.Helper()
	action, ok := desc.Schedule.Action.(*client.ScheduleWorkflowAction)
	require.True(t, ok, "action %T", desc.Schedule.Action)
	require.Len(t, action.Args, 1)
	var in workflows.RetentionInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(action.Args[0].(*commonpb.Payload), &in))
	return in
}

// TestRetention has a Temporal server of its own: the schedule ID is namespace-wide.
func TestRetention(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	schema := e.store.Schema()

	// Two workers start at once; both make sure the schedule exists.
	cfg := e.retentionConfig(ts, config.Retention{BatchSize: 2, Interval: config.Duration(time.Hour)})
	gate := make(chan struct{})
	e.startAppWorker(t, cfg, gate)
	e.startAppWorker(t, cfg, gate)
	close(gate)

	desc := describeRetention(t, e.client, e.taskQueue)
	action := desc.Schedule.Action.(*client.ScheduleWorkflowAction)
	require.Equal(t, workflows.RetentionWorkflowType, action.Workflow)
	require.Equal(t, "outbox-retention-"+e.taskQueue, action.ID, "the task queue's own")
	require.Equal(t, e.taskQueue, action.TaskQueue)
	require.Equal(t, []client.ScheduleIntervalSpec{{Every: time.Hour}}, desc.Schedule.Spec.Intervals)
	require.Equal(t, enumspb.SCHEDULE_OVERLAP_POLICY_SKIP, desc.Schedule.Policy.Overlap)
	require.False(t, desc.Schedule.State.Paused)
	require.Equal(t, workflows.RetentionInput{
		SentAfter: config.DefaultSentRetention, DiscardedAfter: config.DefaultDiscardRetention, BatchSize: 2,
	}, scheduleInput(t, desc))

	// Old rows to remove, and rows to keep.
	_, err := e.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_messages (topic, payload, status, sent_at, created_at, updated_at)
		SELECT 'order.created', '{}', s, now() - interval '8 days', now() - interval '40 days', now() - interval '40 days'
		FROM unnest(ARRAY['sent', 'sent', 'sent', 'sent', 'sent', 'pending', 'dead']) s`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_messages (topic, payload, status, sent_at) VALUES ('order.created', '{}', 'sent', now())`)
	require.NoError(t, err)
	discarded := e.enqueueOrderPlain(t, "order.created", nil)
	_, err = e.store.DeadLetter(ctx, store.DeadLetter{MessageID: discarded, Topic: "order.created", WorkflowID: "w", RunID: "r", Attempts: 1, LastError: "HTTP 422"})
	require.NoError(t, err)
	require.NoError(t, e.store.Discard(ctx, discarded, "test"))
	_, err = e.pool.Exec(ctx, `UPDATE `+schema+`.outbox_messages SET updated_at = now() - interval '31 days' WHERE message_id = $1`, discarded)
	require.NoError(t, err)

	// Triggering the schedule runs a retention workflow that removes them in batches.
	handle := e.client.ScheduleClient().GetHandle(ctx, workflows.RetentionScheduleFor(e.taskQueue))
	require.NoError(t, handle.Trigger(ctx, client.ScheduleTriggerOptions{}))
	var started *client.ScheduleWorkflowExecution
	require.Eventually(t, func() bool {
		d, err := handle.Describe(ctx)
		require.NoError(t, err)
		if n := len(d.Info.RecentActions); n > 0 {
			started = d.Info.RecentActions[n-1].StartWorkflowResult
		}
		return started != nil
	}, 30*time.Second, 50*time.Millisecond)
	var res workflows.RetentionResult
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, e.client.GetWorkflow(runCtx, started.WorkflowID, started.FirstExecutionRunID).Get(runCtx, &res))
	require.Equal(t, workflows.RetentionResult{Batches: 4, SentMessages: 5, DiscardedMessages: 1, DeadLetters: 1, Runs: 1}, res)

	var statuses []byte
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT jsonb_object_agg(status, n) FROM (SELECT status, count(*) n FROM `+schema+`.outbox_messages GROUP BY status) s`).Scan(&statuses))
	var byStatus map[string]int
	require.NoError(t, json.Unmarshal(statuses, &byStatus))
	require.Equal(t, map[string]int{"sent": 1, "pending": 1, "dead": 1}, byStatus)
	dls, err := e.store.DeadLetters(ctx, discarded)
	require.NoError(t, err)
	require.Empty(t, dls)

	// A worker with changed settings updates the schedule; a pause from the UI stays.
	require.NoError(t, handle.Pause(ctx, client.SchedulePauseOptions{Note: "paused by an operator"}))
	changed := e.retentionConfig(ts, config.Retention{Archive: true, Interval: config.Duration(2 * time.Hour)})
	e.startAppWorker(t, changed, gate)
	require.Eventually(t, func() bool {
		d, err := handle.Describe(ctx)
		require.NoError(t, err)
		desc = d
		return len(d.Schedule.Spec.Intervals) == 1 && d.Schedule.Spec.Intervals[0].Every == 2*time.Hour
	}, 30*time.Second, 50*time.Millisecond)
	require.True(t, desc.Schedule.State.Paused)
	require.Equal(t, "paused by an operator", desc.Schedule.State.Note)
	require.Equal(t, workflows.RetentionInput{
		SentAfter: config.DefaultSentRetention, DiscardedAfter: config.DefaultDiscardRetention, Archive: true, BatchSize: config.DefaultRetentionBatch,
	}, scheduleInput(t, desc))
	require.Equal(t, e.taskQueue, desc.Schedule.Action.(*client.ScheduleWorkflowAction).TaskQueue)

	// The same settings again change nothing: the update finds the schedule as it should
	// be and sends no update. (The schedule's update time is no witness: the server may
	// apply a retried update request twice.)
	c := changed.WithDefaults()
	updates := &countingScheduleClient{ScheduleClient: e.client.ScheduleClient()}
	require.NoError(t, worker.EnsureRetentionSchedule(ctx, scheduleClientOf{Client: e.client, schedules: updates}, e.taskQueue, c.Retention.WorkflowInput(), 2*time.Hour))
	require.Equal(t, int32(1), updates.calls.Load(), "Ensure looked at the schedule")
	require.Zero(t, updates.sent.Load(), "and sent no update")
	again, err := handle.Describe(ctx)
	require.NoError(t, err)
	require.Equal(t, desc.Schedule.Spec.Intervals, again.Schedule.Spec.Intervals)
	require.True(t, again.Schedule.State.Paused)
}

// scheduleClientOf is a client whose ScheduleClient is schedules.
type scheduleClientOf struct {
	client.Client
	schedules client.ScheduleClient
}

func (c scheduleClientOf) ScheduleClient() client.ScheduleClient { return c.schedules }

// countingScheduleClient counts the Update calls of its handles, and the updates they
// sent (those whose DoUpdate did not skip).
type countingScheduleClient struct {
	client.ScheduleClient
	calls, sent atomic.Int32
}

func (c *countingScheduleClient) GetHandle(ctx context.Context, id string) client.ScheduleHandle {
	return countingScheduleHandle{ScheduleHandle: c.ScheduleClient.GetHandle(ctx, id), c: c}
}

type countingScheduleHandle struct {
	client.ScheduleHandle
	c *countingScheduleClient
}

func (h countingScheduleHandle) Update(ctx context.Context, options client.ScheduleUpdateOptions) error {
	h.c.calls.Add(1)
	do := options.DoUpdate
	options.DoUpdate = func(in client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
		u, err := do(in)
		if err == nil {
			h.c.sent.Add(1)
		}
		return u, err
	}
	return h.ScheduleHandle.Update(ctx, options)
}

// TestRetentionSchedulesOfTwoOutboxes runs two outbox databases on one namespace, each on
// its own task queue: each has a retention schedule of its own, which the other's worker
// leaves alone. The schedule outbox-retention that an earlier release made for one of
// them (paused by an operator) gives way to that outbox's own, which keeps the pause.
func TestRetentionSchedulesOfTwoOutboxes(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	orders, billing := newEnv(t, ts), newEnv(t, ts)
	ctx := context.Background()
	schedules := orders.client.ScheduleClient()
	in := workflows.RetentionInput{SentAfter: config.DefaultSentRetention, DiscardedAfter: config.DefaultDiscardRetention, BatchSize: 100}

	_, err := schedules.Create(ctx, client.ScheduleOptions{
		ID:   workflows.RetentionScheduleID,
		Spec: client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: time.Hour}}},
		Action: &client.ScheduleWorkflowAction{ID: workflows.RetentionWorkflowID, Workflow: workflows.RetentionWorkflowType,
			Args: []any{in}, TaskQueue: orders.taskQueue},
		Overlap: enumspb.SCHEDULE_OVERLAP_POLICY_SKIP,
		Paused:  true,
		Note:    "paused by an operator",
	})
	require.NoError(t, err)

	require.NoError(t, worker.EnsureRetentionSchedule(ctx, orders.client, orders.taskQueue, in, time.Hour))
	require.NoError(t, worker.EnsureRetentionSchedule(ctx, billing.client, billing.taskQueue, in, 2*time.Hour))
	require.NoError(t, worker.EnsureRetentionSchedule(ctx, orders.client, orders.taskQueue, in, time.Hour), "a restart")

	for _, tc := range []struct {
		e      *env
		every  time.Duration
		paused bool
	}{{orders, time.Hour, true}, {billing, 2 * time.Hour, false}} {
		desc := describeRetention(t, tc.e.client, tc.e.taskQueue)
		action := desc.Schedule.Action.(*client.ScheduleWorkflowAction)
		require.Equal(t, tc.e.taskQueue, action.TaskQueue)
		require.Equal(t, workflows.RetentionScheduleFor(tc.e.taskQueue), action.ID)
		require.Equal(t, []client.ScheduleIntervalSpec{{Every: tc.every}}, desc.Schedule.Spec.Intervals)
		require.Equal(t, tc.paused, desc.Schedule.State.Paused, tc.e.taskQueue)
		if tc.paused {
			require.Equal(t, "paused by an operator", desc.Schedule.State.Note)
		}
	}
	_, err = schedules.GetHandle(ctx, workflows.RetentionScheduleID).Describe(ctx)
	var notFound *serviceerror.NotFound
	require.ErrorAs(t, err, &notFound, "the earlier release's schedule is gone")
}

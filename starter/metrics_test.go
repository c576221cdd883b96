package starter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"

	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func TestRelayMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	rec := newRecorder()
	r, st := setup(t, rec, starter.Config{Metrics: m, Lease: time.Minute})

	enqueue(t, st, "order.created", nil)
	enqueue(t, st, "order.created", nil)
	running := enqueue(t, st, "order.created", nil)
	failing := enqueue(t, st, "order.created", nil)
	rec.status[workflows.WorkflowID(running.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	rec.startErr = func(id string) error {
		switch id {
		case workflows.WorkflowID(running.String()):
			return serviceerror.NewWorkflowExecutionAlreadyStarted("running", "", "run-1")
		case workflows.WorkflowID(failing.String()):
			return errors.New("frontend unavailable")
		}
		return nil
	}

	n, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, n)
	n, err = r.RunOnce(context.Background()) // nothing due: no batch
	require.NoError(t, err)
	require.Zero(t, n)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outbox_messages_claimed_total Rows the relay claimed (a row claimed again after its lease expired counts again).
# TYPE outbox_messages_claimed_total counter
outbox_messages_claimed_total 4
# HELP outbox_workflows_already_started_total Workflow starts that met an existing run of the message's workflow.
# TYPE outbox_workflows_already_started_total counter
outbox_workflows_already_started_total 1
# HELP outbox_workflows_started_total Delivery workflows the relay started.
# TYPE outbox_workflows_started_total counter
outbox_workflows_started_total 2
`), "outbox_messages_claimed_total", "outbox_workflows_started_total", "outbox_workflows_already_started_total"))
	histograms, err := testutil.GatherAndCount(reg, "outbox_relay_batch_size", "outbox_relay_batch_duration_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, histograms)
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		switch f.GetName() {
		case "outbox_relay_batch_size":
			require.Equal(t, uint64(1), f.GetMetric()[0].GetHistogram().GetSampleCount())
			require.Equal(t, 4.0, f.GetMetric()[0].GetHistogram().GetSampleSum())
		case "outbox_errors_total":
			for _, s := range f.GetMetric() {
				want := 0.0
				if s.GetLabel()[0].GetValue() == metrics.OpStartWorkflow {
					want = 1
				}
				require.Equal(t, want, s.GetCounter().GetValue(), s.GetLabel()[0].GetValue())
			}
		}
	}
}

// A message its run delivered but could not record (the database was away when it tried)
// is counted sent by whoever records it: the relay, when a start meets the completed run,
// or reconciliation. No worker counted it.
func TestRecordingACompletedRunCountsTheMessageSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	m.KnownTopics("order.created")
	sent := func() float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "outbox_messages_sent_total" {
				for _, s := range f.GetMetric() {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	rec := newRecorder()
	r, st := setup(t, rec, starter.Config{Metrics: m})

	byRelay := enqueue(t, st, "order.created", nil)
	rec.status[workflows.WorkflowID(byRelay.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	rec.startErr = func(id string) error {
		if id == workflows.WorkflowID(byRelay.String()) {
			return serviceerror.NewWorkflowExecutionAlreadyStarted("completed", "", "run-1")
		}
		return nil
	}
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, store.StatusSent, status(t, st, byRelay))
	require.Equal(t, 1.0, sent(), "the relay recorded it sent")

	byReconciler := enqueue(t, st, "order.created", nil)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	_, err = st.DB().Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET updated_at = now() - interval '10 minutes' WHERE message_id = $1`, byReconciler)
	require.NoError(t, err)
	rec.status[workflows.WorkflowID(byReconciler.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	rc, err := starter.NewReconciler(st, rec, starter.ReconcilerConfig{After: time.Minute, Metrics: m})
	require.NoError(t, err)
	_, err = rc.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, store.StatusSent, status(t, st, byReconciler))
	require.Equal(t, 2.0, sent(), "reconciliation recorded it sent")
}

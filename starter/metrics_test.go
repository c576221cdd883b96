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

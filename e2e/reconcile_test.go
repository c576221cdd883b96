package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestReconcileLostWorkflow: a message whose workflow is deleted or terminated through
// the Temporal API while it waits to retry is handed over again by the relay and
// delivered anyway.
func TestReconcileLostWorkflow(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	for name, lose := range map[string]func(ctx context.Context, e *env, workflowID string) error{
		"Deleted": func(ctx context.Context, e *env, workflowID string) error {
			_, err := e.client.WorkflowService().DeleteWorkflowExecution(ctx, &workflowservice.DeleteWorkflowExecutionRequest{
				Namespace:         e.namespace,
				WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: workflowID},
			})
			return err
		},
		"Terminated": func(ctx context.Context, e *env, workflowID string) error {
			return e.client.TerminateWorkflow(ctx, workflowID, "", "an operator's mistake")
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, ts)
			e.startSlowDelivery(t)

			id := e.runWaitingToRetry(t)
			first := e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId()
			require.NoError(t, lose(ctx, e, workflows.WorkflowID(id.String())))
			e.recv.ClearStatus("order.slow")

			e.waitStatus(t, id, store.StatusSent)
			requests, effects := e.recv.Count(id.String())
			require.Equal(t, 2, requests)
			require.Equal(t, 1, effects)
			audit, err := e.store.Audit(ctx, id)
			require.NoError(t, err)
			require.NotEmpty(t, audit)
			require.Equal(t, "reconcile", audit[0].Action)
			require.NotEqual(t, first, e.describe(t, id).GetWorkflowExecutionInfo().GetExecution().GetRunId(), "a new run delivered it")
		})
	}
}

// TestReconcileMassFailure: 2,000 dispatched rows whose workflows are gone (after a
// namespace reset, say) are repaired by two relays' reconcilers sharing the work: each row
// once, within minutes.
func TestReconcileMassFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	const rows = 2000
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.store.Schema()+`.outbox_messages (topic, payload, status, dispatched_at, updated_at)
		SELECT 'order.created', '{}', 'dispatched', now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, $1)`, rows)
	require.NoError(t, err)

	var passes sync.Map
	began := time.Now()
	for i := range 2 {
		rc, err := starter.NewReconciler(e.store, e.client, starter.ReconcilerConfig{
			After: time.Minute, Interval: 50 * time.Millisecond, Logger: logger,
			OnPass: func(r starter.ReconcileResult) { passes.Store(i, true) },
		})
		require.NoError(t, err)
		e.run(t, rc.Run)
	}
	var audited int
	require.Eventually(t, func() bool {
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.store.Schema()+`.outbox_audit WHERE action = 'reconcile'`).Scan(&audited))
		return audited == rows
	}, 3*time.Minute, 100*time.Millisecond, "%d of %d rows repaired", audited, rows)
	t.Logf("%d rows repaired in %s", rows, time.Since(began).Round(time.Millisecond))

	var pending, twice int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages WHERE status = 'pending'`).Scan(&pending))
	require.Equal(t, rows, pending, "every row handed over again")
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT message_id FROM `+e.store.Schema()+`.outbox_audit GROUP BY message_id HAVING count(*) > 1) d`).Scan(&twice))
	require.Zero(t, twice, "no row repaired twice")
	_, ok0 := passes.Load(0)
	_, ok1 := passes.Load(1)
	require.True(t, ok0 && ok1, "both reconcilers ran")
}

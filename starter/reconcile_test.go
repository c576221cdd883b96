package starter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := newRecorder()
	pool, st := testdb.Schema(t)
	r, err := starter.New(st, pool, rec, starter.Config{})
	require.NoError(t, err)
	rc, err := starter.NewReconciler(st, rec, starter.ReconcilerConfig{After: time.Minute})
	require.NoError(t, err)
	reconcile := func() int {
		res, err := rc.RunOnce(ctx)
		require.NoError(t, err)
		return res.Total()
	}

	missing := enqueue(t, st, "t", nil)
	completed := enqueue(t, st, "t", nil)
	running := enqueue(t, st, "t", nil)
	paused := enqueue(t, st, "t", nil)
	terminated := enqueue(t, st, "t", nil)
	fresh := enqueue(t, st, "t", nil)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	// All six are dispatched; all but the fresh one long ago.
	_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET updated_at = now() - interval '10 minutes' WHERE message_id <> $1`, fresh)
	require.NoError(t, err)
	rec.status[workflows.WorkflowID(completed.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	rec.status[workflows.WorkflowID(running.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	rec.status[workflows.WorkflowID(paused.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED
	rec.status[workflows.WorkflowID(terminated.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED
	rec.status[workflows.WorkflowID(fresh.String())] = enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED

	require.Equal(t, 3, reconcile())
	require.Equal(t, store.StatusPending, status(t, st, missing), "a missing workflow: handed over again")
	require.Equal(t, store.StatusSent, status(t, st, completed), "a completed workflow: recorded sent")
	require.Equal(t, store.StatusDispatched, status(t, st, running))
	require.Equal(t, store.StatusDispatched, status(t, st, paused), "a paused workflow is open: it goes on once unpaused")
	require.Equal(t, store.StatusPending, status(t, st, terminated), "a terminated workflow: handed over again")
	require.Equal(t, store.StatusDispatched, status(t, st, fresh), "too recent to look at")

	audit, err := st.Audit(ctx, missing)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "reconcile", audit[0].Action)
	s, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), s.RepairedLastDay)

	// The running one was touched, so a second pass right away repairs nothing.
	require.Zero(t, reconcile())

	// The repaired rows are claimed and started again.
	before := len(rec.starts)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, before+2, len(rec.starts))
}

// deadlineRecorder is a store that records whether the claims of stale dispatched rows
// were given a deadline, and claims nothing.
type deadlineRecorder struct {
	*store.Store
	bounded chan bool
}

func (s deadlineRecorder) ClaimStaleDispatched(ctx context.Context, _ time.Duration, _ int) ([]store.Dispatched, error) {
	_, ok := ctx.Deadline()
	s.bounded <- ok
	return nil, nil
}

// A pass's claim has a deadline of its own even when the pass has none (Run's context
// ends only at shutdown): a database that stops answering mid-query fails the pass instead
// of stopping reconciliation for good.
func TestReconcileClaimIsBounded(t *testing.T) {
	t.Parallel()
	_, st := testdb.Schema(t)
	bounded := make(chan bool, 1)
	rc, err := starter.NewReconciler(deadlineRecorder{st, bounded}, newRecorder(), starter.ReconcilerConfig{})
	require.NoError(t, err)
	_, err = rc.RunOnce(context.Background())
	require.NoError(t, err)
	require.True(t, <-bounded, "the claim had no deadline")
}

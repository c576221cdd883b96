package starter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// batchRecorder stands in for Temporal for the batch lane: it records the batch runs'
// inputs and starts every run.
type batchRecorder struct {
	mu      sync.Mutex
	batches []workflows.BatchInput
	started chan string
}

func (r *batchRecorder) ExecuteWorkflow(_ context.Context, opts client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := args[0].(workflows.BatchInput); ok {
		r.batches = append(r.batches, in)
	}
	r.started <- opts.ID
	return nil, nil
}

func (r *batchRecorder) DescribeWorkflowExecution(context.Context, string, string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	return nil, nil
}

// A batch starts under the policy its rows were held under: a policy published while
// they wait (here one that takes the topic out of the batch lane) reaches later claims,
// and the waiting batch's run still has its Batch settings (a run without them could not
// deliver its rows).
func TestBatchKeepsThePolicyItsRowsWereHeldUnder(t *testing.T) {
	t.Parallel()
	var batched atomic.Bool
	batched.Store(true)
	policy := func(string) workflows.Policy {
		if batched.Load() {
			return workflows.Policy{Batch: &workflows.BatchPolicy{Size: 100, Wait: 2 * time.Second}}
		}
		return workflows.Policy{}
	}
	rec := &batchRecorder{started: make(chan string, 10)}
	pool, st := testdb.Schema(t)
	r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "q", Policy: policy, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	id := enqueue(t, st, "clicks", nil)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	// Claimed and held for its batch's wait; then the policy changes.
	require.Eventually(t, func() bool { return status(t, st, id) == store.StatusClaimed }, 10*time.Second, 10*time.Millisecond)
	batched.Store(false)
	select {
	case wid := <-rec.started:
		require.Equal(t, workflows.BatchWorkflowID(id.String()), wid)
	case <-time.After(10 * time.Second):
		t.Fatal("the batch did not start")
	}
	rec.mu.Lock()
	in := rec.batches[0]
	rec.mu.Unlock()
	require.NotNil(t, in.Policy.Batch, "the run has the policy the row was held under")
	require.Equal(t, 100, in.Policy.Batch.Size)
	require.Eventually(t, func() bool {
		row, err := st.Get(context.Background(), id)
		require.NoError(t, err)
		return row.Status == store.StatusDispatched && row.BatchID != nil && *row.BatchID == workflows.BatchWorkflowID(id.String())
	}, 10*time.Second, 10*time.Millisecond)
}

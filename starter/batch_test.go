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
// they wait (here one that takes the topic out of the batch lane right after the claim
// read it) reaches later claims, and the waiting batch's run still has its Batch settings
// (a run without them could not deliver its rows).
func TestBatchKeepsThePolicyItsRowsWereHeldUnder(t *testing.T) {
	t.Parallel()
	var reads atomic.Int32
	policy := func(string) workflows.Policy {
		if reads.Add(1) == 1 {
			return workflows.Policy{Batch: &workflows.BatchPolicy{Size: 100, Wait: 2 * time.Second}}
		}
		return workflows.Policy{} // published since the claim read the policy
	}
	rec := &batchRecorder{started: make(chan string, 10)}
	pool, st := testdb.Schema(t)
	r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "q", Policy: policy})
	require.NoError(t, err)
	reads.Store(0) // New checked the policy of topics without their own
	id := enqueue(t, st, "clicks", nil)

	// RunOnce claims the row, holds it for its batch, and starts the batch (it does not
	// wait out the batch's wait).
	n, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, int32(1), reads.Load(), "the claim read the policy once")
	require.Len(t, rec.started, 1)
	require.Equal(t, workflows.BatchWorkflowID(id.String()), <-rec.started)
	in := rec.batches[0]
	require.NotNil(t, in.Policy.Batch, "the run has the policy the row was held under")
	require.Equal(t, 100, in.Policy.Batch.Size)
	row, err := st.Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, store.StatusDispatched, row.Status)
	require.NotNil(t, row.BatchID)
	require.Equal(t, workflows.BatchWorkflowID(id.String()), *row.BatchID)
}

// A batch topic's limit of messages in flight is lifted while its rows go to batches (a
// batch gathers more than the limit), and put back once they no longer do: a published
// policy that takes the topic out of the batch lane starts its backlog a run each again,
// within the limit.
func TestBatchTopicGetsItsLimitBackOutOfTheLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var batched atomic.Bool
	batched.Store(true)
	policy := func(string) workflows.Policy {
		if batched.Load() {
			return workflows.Policy{Batch: &workflows.BatchPolicy{Size: 100, Wait: 2 * time.Second}}
		}
		return workflows.Policy{}
	}
	rec := &batchRecorder{started: make(chan string, 100)}
	pool, st := testdb.Schema(t)
	r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "q", Policy: policy, MaxInFlightPerTopic: 2, BatchSize: 10})
	require.NoError(t, err)
	for range 8 {
		enqueue(t, st, "clicks", nil)
	}
	// The limit parks all but two of the rows; the claim found the topic full, so the
	// limit is lifted and the next claim gathers the rest for the batch.
	for range 2 {
		_, err = r.RunOnce(ctx)
		require.NoError(t, err)
	}
	s, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(8), s.ByTopic["clicks"][store.StatusDispatched], "all in batches")
	for len(rec.started) > 0 {
		<-rec.started
	}

	// Out of the batch lane: the next rows are started a run each, two in flight at most
	// beside the batches' eight.
	batched.Store(false)
	for range 4 {
		enqueue(t, st, "clicks", nil)
	}
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, rec.started, "the topic is over its limit already")
}

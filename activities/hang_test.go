package activities_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// hangingGets is the outbox's database hanging for its first reads of a message (a
// partition without a reset, a pool with no free connection): Get blocks until its
// context ends, as pgx does.
type hangingGets struct {
	*store.Store
	hangs atomic.Int32 // how many Gets still hang
}

func (s *hangingGets) Get(ctx context.Context, id uuid.UUID) (store.Row, error) {
	if s.hangs.Add(-1) >= 0 {
		<-ctx.Done()
		return store.Row{}, ctx.Err()
	}
	return s.Store.Get(ctx, id)
}

// A database that hangs while a message is loaded costs the delivery no attempt: the
// read gives up within half of what the attempt has left, the send reports the database
// unavailable, and the run waits and tries the same attempt again. A message with one
// attempt is delivered once the database answers, not dead-lettered as timed out.
func TestHangingDatabaseUsesUpNoAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{"n": 1}`)})
	require.NoError(t, err)

	hanging := &hangingGets{Store: st}
	hanging.hangs.Store(2)
	var sends []int
	reg := activities.NewRegistry()
	reg.Handle("order.created", delivery.HandlerFunc(func(_ context.Context, m delivery.Message) error {
		sends = append(sends, m.Attempt)
		return nil
	}))
	a := &activities.Activities{Store: hanging, Handlers: reg}

	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	// The local attempts run in real time (two reads waited out, about 2 s in all):
	// more than the environment's default limit of 3 s leaves for a busy machine.
	env.SetTestTimeout(time.Minute)
	env.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	a.Register(env)
	policy := workflows.Policy{MaxAttempts: 1, SendTimeout: 2 * time.Second}
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{WorkflowTaskTimeout: workflows.FirstTaskTimeout(policy.SendTimeout)})
	env.ExecuteWorkflow(workflows.WorkflowType, workflows.DeliveryInput{
		MessageID: id.String(), Topic: "order.created", Policy: policy, Version: workflows.DeliveryVersion,
	})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []int{1}, sends, "sent once, as attempt 1 of 1")
	require.Negative(t, hanging.hangs.Load(), "the hanging reads were waited out")
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusSent, row.Status)
	require.Zero(t, row.RetryTimes)
}
